"""What a sweep writes: the table (sweep.csv, sweep.parquet: one row per point, every headline metric, a
``pareto`` column) and sweep.html (step time and HFU against chips per chip generation, the Pareto front,
the best placement per topology), each file written atomically (tpusim/output.py)."""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import Any

from tpusim.output import atomic_open, write_atomic
from tpusim.report.text import HFU_LABEL
from tpusim.sweep.pareto import pareto_flags, serving_flags, serving_front
from tpusim.sweep.point import COLUMNS
from tpusim.units import format_seconds


def sweep_table(rows: list[dict[str, Any]], script_columns: tuple[str, ...] = ()) -> Any:
    """Rows -> DataFrame in COLUMNS order (the script's swept arguments after ``placement``, and the
    ``recording`` each was priced against), sorted by chip, topology, slices, mode, placement, script
    arguments, with ``pareto``: on the front of step time vs chips used among rows of the same script arguments
    (a bigger batch is another workload, not a slower configuration; a one-chip script's bigger slice is no
    faster, its other chips idle), and ``serving_pareto`` for inference programs: on the front of tokens/s per
    chip vs time per output token among rows of the same chip and slice (here batch and context are the knobs
    a server turns, so they are points of one front)."""
    import pandas as pd

    at = COLUMNS.index("placement") + 1
    columns = [*COLUMNS[:at], *script_columns, *COLUMNS[at:], *(("recording",) if script_columns else ())]
    table = pd.DataFrame([{c: row.get(c) for c in columns} for row in rows], columns=columns)
    for column in ("chips", "chips_used", "hbm_peak_bytes", "kernels"):   # whole numbers; missing on rows not priced
        table[column] = table[column].astype("Int64")
    table["chips_used"] = table["chips_used"].fillna(table["chips"])      # rows that do not say used every chip
    table = table.sort_values(["chip", "topology", "slices", "mode", "placement", *script_columns], kind="stable")
    table = table.reset_index(drop=True)
    table["pareto"] = False
    group = table.groupby(list(script_columns), sort=False, dropna=False).ngroup() if script_columns else None
    for index in ([table.index[group == g] for g in group.unique()] if group is not None else [table.index]):
        part = table.loc[index]
        ok = part["status"] == "ok"
        chips = [int(c) if k else None for c, k in zip(part["chips_used"], ok)]
        steps = [float(s) if k and pd.notna(s) else None for s, k in zip(part["step_time_s"], ok)]   # None: no steps
        table.loc[index, "pareto"] = pareto_flags(chips, steps)
    table["pareto"] = table["pareto"].astype(bool)
    table["serving_pareto"] = False
    for _, part in table.groupby(["chip", "calibrated", "topology", "slices"], sort=False, dropna=False):
        ok = part["status"] == "ok"
        tpot = [float(t) if k and pd.notna(t) else None for t, k in zip(part["tpot_median_s"], ok)]
        rate = [float(r) if k and pd.notna(r) else None for r, k in zip(part["tokens_per_s_per_chip"], ok)]
        table.loc[part.index, "serving_pareto"] = serving_flags(tpot, rate)
    table["serving_pareto"] = table["serving_pareto"].astype(bool)
    return table


def script_columns_of(table: Any) -> list[str]:
    """The swept script arguments' columns (those between ``placement`` and ``chips``)."""
    names = list(table.columns)
    return names[names.index("placement") + 1:names.index("chips")]


def best_placements(table: Any) -> Any:
    """The fastest row per chip x topology x slices (its mode and placement say what wins there)."""
    ok = table[(table["status"] == "ok") & table["step_time_s"].notna()]     # a script with no steps: no step time
    if ok.empty:
        return ok
    script = script_columns_of(table)
    index = ok.groupby(["chip", "topology", "slices", *script])["step_time_s"].idxmin()
    return ok.loc[index, ["chip", "topology", "slices", *script, "chips", "mode", "placement", "step_time_s",
                          "hfu"]]


def _figure_png(table: Any, metric: str, label: str) -> str:
    """``metric`` against chips, one series per chip generation (and the Pareto front on step time)."""
    from matplotlib.figure import Figure  # no pyplot: a notebook's own backend stays as it was

    figure = Figure(figsize=(7, 4.2))
    axes = figure.subplots()
    ok = table[table["status"] == "ok"]
    for chip, group in ok.groupby("chip"):
        axes.scatter(group["chips"], group[metric], label=chip, alpha=0.75)
    if metric == "step_time_s":
        front = ok[ok["pareto"]].sort_values("chips")
        axes.step(front["chips"], front["step_time_s"], where="post", color="black", linewidth=1,
                  label="Pareto front")
        axes.set_yscale("log")
    axes.set_xscale("log", base=2)
    return _finished_png(figure, axes, "chips", label)


def _by_argument_png(table: Any, argument: str, metric: str, label: str) -> str:
    """``metric`` against one swept script argument (e.g. step time per batch size), one line per chip x
    topology x slices, each value the best over modes, placements and the other arguments."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4.2))
    axes = figure.subplots()
    ok = table[(table["status"] == "ok") & table[metric].notna()]
    best = max if metric == "tokens_per_s_per_chip" else min
    for (chip, topology, slices), group in ok.groupby(["chip", "topology", "slices"]):
        values = group.groupby(argument)[metric].agg(best).sort_index()
        name = f"{chip} {topology}{f' x{slices}' if slices > 1 else ''}"
        axes.plot([str(v) for v in values.index], values.to_numpy(dtype=float), marker="o", label=name)
    return _finished_png(figure, axes, argument, label)


def _finished_png(figure: Any, axes: Any, xlabel: str, ylabel: str) -> str:
    """Label, grid and legend ``axes``, then ``figure`` as base64 PNG text for an <img> in sweep.html."""
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize="small")
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _by_argument_sections(table: Any) -> list[str]:
    parts = []
    for argument in script_columns_of(table):
        for metric, label in (("step_time_s", "step time (s)"), ("hbm_peak_bytes", "HBM peak (bytes)"),
                              ("tokens_per_s_per_chip", "tokens/s per chip"),
                              ("tpot_median_s", "TPOT median (s)")):
            if table.loc[table["status"] == "ok", metric].notna().any():
                title = label.split(" (")[0]
                parts += [f"<h2>{html.escape(title[0].upper() + title[1:])} against {html.escape(argument)}</h2>",
                          f"<img alt='{html.escape(label)} vs {html.escape(argument)}' src='data:image/png;base64,"
                          f"{_by_argument_png(table, argument, metric, label)}'>"]
    return parts


def idle_note(table: Any) -> str | None:
    """Why a one-chip script's front holds one point: the slices' other chips idle (None for a script that
    uses every chip)."""
    ok = table[table["status"] == "ok"]
    if ok.empty or (ok["chips_used"] == ok["chips"]).all():
        return None
    return ("the script runs no collective, so it uses one chip of each slice and the slices' other chips idle; "
            "the Pareto front counts the chips used")


SERVING_COLUMNS = ("tpot_median_s", "ttft_s", "tokens_per_s_per_chip")


def serving_front_lines(table: Any) -> list[str]:
    """The terminal's serving front: per chip and slice, the points no other beats on both tokens/s per chip
    and time per output token (empty for a sweep of training scripts)."""
    front = serving_front(table)
    if front.empty:
        return []
    script = script_columns_of(table)
    lines = ["Serving Pareto front (tokens/s per chip vs TPOT, per chip and slice"
             + (f"; over {', '.join(script)}" if script else "") + "):"]
    rows = front.to_dict("records")
    places = [f"{row['chip']} {row['topology']}" + (f" x{row['slices']}" if row["slices"] > 1 else "") for row in rows]
    givens = [" ".join(f"{name}={row[name]}" for name in script) for row in rows]
    place_width, width = max(map(len, places)), max(map(len, givens))
    for row, place, given in zip(rows, places, givens):
        ttft = format_seconds(row["ttft_s"]) if _number(row["ttft_s"]) else "-"
        lines.append(f"  {place.ljust(place_width)}  {given.ljust(width)}  TPOT "
                     f"{format_seconds(row['tpot_median_s']):>9}  TTFT {ttft:>9}  "
                     f"{row['tokens_per_s_per_chip']:>10,.0f} tokens/s per chip  {row['mode']} {row['placement']}")
    return lines


def _number(value: Any) -> bool:
    """Whether a table cell holds a number (not None, not NaN)."""
    return value is not None and value == value


def _html_table(frame: Any) -> str:
    return frame.to_html(index=False, na_rep="-", float_format=lambda v: f"{v:.4g}", border=0)


def sweep_html(table: Any, title: str) -> str:
    failed = table[table["status"] != "ok"]
    parts = [f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title>",
             "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
             "td,th{padding:2px 8px;border-bottom:1px solid #ddd;text-align:right}</style>",
             f"<h1>{html.escape(title)}</h1>",
             f"<p>{len(table)} points: {int((table['status'] == 'ok').sum())} priced, "
             f"{int((table['status'] == 'invalid').sum())} invalid, {int((table['status'] == 'failed').sum())} "
             f"failed.</p>"]
    if note := idle_note(table):
        parts.append(f"<p><b>Note:</b> {html.escape(note)}.</p>")
    stepped = table.loc[table["status"] == "ok", "step_time_s"].notna().any()     # steps marked (not a decode loop)
    if stepped:
        parts += ["<h2>Step time against chips</h2>",
                  f"<img alt='step time vs chips' src='data:image/png;base64,"
                  f"{_figure_png(table, 'step_time_s', 'step time (s)')}'>",
                  f"<h2>{HFU_LABEL} against chips</h2>",
                  f"<img alt='HFU vs chips' src='data:image/png;base64,{_figure_png(table, 'hfu', HFU_LABEL)}'>"]
    if (table["status"] == "ok").any():
        parts += _by_argument_sections(table)
    if stepped:
        parts += ["<h2>Pareto front (step time vs chips)</h2>", _html_table(
                      table[table["pareto"]].sort_values([*script_columns_of(table), "chips"])[
                          ["chip", "topology", "slices", *script_columns_of(table), "chips", "mode", "placement",
                           "step_time_s", "hfu"]]),
                  "<h2>Best mode and placement per topology</h2>", _html_table(best_placements(table))]
    if not (front := serving_front(table)).empty:
        parts += ["<h2>Serving Pareto front (tokens/s per chip vs time per output token, per chip and slice)</h2>",
                  _html_table(front[["chip", "topology", "slices", *script_columns_of(table), "mode", "placement",
                                     *SERVING_COLUMNS]])]
    if not failed.empty:
        parts += ["<h2>Points not priced</h2>",
                  _html_table(failed[["chip", "topology", "slices", "mode", "placement", *script_columns_of(table),
                                      "status", "error"]])]
    parts += ["<h2>All points</h2>", _html_table(table)]
    return "\n".join(parts)


def write_sweep(table: Any, out_dir: Path, title: str) -> dict[str, Path]:
    """sweep.csv, sweep.parquet, sweep.html in ``out_dir``; returns their paths."""
    files = {"csv": out_dir / "sweep.csv", "parquet": out_dir / "sweep.parquet", "html": out_dir / "sweep.html"}
    write_atomic(files["csv"], table.to_csv(index=False))
    with atomic_open(files["parquet"], "wb") as handle:
        table.to_parquet(handle, index=False)
    write_atomic(files["html"], sweep_html(table, title))
    return files
