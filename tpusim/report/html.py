"""report.html: one self-contained page (figures embedded as base64 PNG) that opens offline.

Read at a glance: the headline cards and the verdict first, then the figures; every table (the per-mode
table with every row of the terminal summary, ops, grouped collectives, links, stalls) sits in a
collapsible <details> section, so no raw row has to be scrolled through. No script, no external file.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any

from tpusim.report.model import incomplete_reason
from tpusim.report.summary import budget_line, mode_rows, recorded_prefix, warmup_lines
from tpusim.report.text import percent_text, seconds_text
from tpusim.units import format_bytes

STYLE = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:2em;border-bottom:1px solid #ddd}
.cards{display:flex;flex-wrap:wrap;gap:1em}.card{border:1px solid #ddd;border-radius:6px;padding:.7em 1em}
.card b{display:block;font-size:1.3em}.bad{color:#b00}table{border-collapse:collapse;font-size:.85em}
td,th{border-bottom:1px solid #eee;padding:.25em .6em;text-align:right}td:first-child,th:first-child{text-align:left}
img{max-width:100%}.warn{background:#fff4e5;padding:.4em .8em;border-left:4px solid #f0a020;margin:.3em 0}
.verdict{background:#eef5ff;padding:.6em 1em;border-left:4px solid #3070d0;margin:1em 0}
details{margin:.6em 0}summary{cursor:pointer;font-weight:600}pre{background:#f6f6f6;padding:1em;overflow:auto}
"""
COLLECTIVE_GROUPS_SHOWN = 50


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _section(title: str, body: str, open_: bool = False) -> str:
    """A collapsible section: the page reads at a glance; the rows are one click away."""
    return f"<details{' open' if open_ else ''}><summary>{html.escape(title)}</summary>{body}</details>"


def _image(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<p><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}"></p>'


def headline_cards(mode: dict[str, Any], name: str) -> list[tuple[str, str]]:
    """The headline numbers of the fastest mode's steady-state step (tpusim/report/headline.py)."""
    head = mode.get("headline") or {}
    steps = mode.get("steps") or {}
    step = seconds_text(mode["step_time_median_s"]) + f" ({name})" if steps.get("count") else "no steps marked"
    cards = [("step time (steady median)", step)]
    if head.get("tokens_per_s_per_chip") is not None:
        cards += [("tokens/s per chip", f"{head['tokens_per_s_per_chip']:,.0f}"),
                  ("tokens/s per slice", f"{head['tokens_per_s_per_slice']:,.0f}")]
    cards += [("TFLOP/s per chip", f"{head.get('tflops_per_s_per_chip', 0.0):.3g}"),
              ("MFU (dtype peak)", percent_text(mode["mfu"])),
              ("HBM peak", f"{format_bytes(mode['hbm']['peak_bytes'])} "
                           f"of {format_bytes(mode['hbm']['capacity_bytes'])}"),
              ("exposed communication", percent_text(head.get("exposed_comm_share"))),
              ("bound by", head.get("bound") or "-")]
    return cards


def collective_groups_html(mode: dict[str, Any]) -> str:
    groups = mode.get("collective_groups") or []
    rows = [[g["kind"], g["group_size"], ",".join(g["axes"]), format_bytes(g["bytes"]), g["count"],
             format_bytes(g["total_bytes"]), seconds_text(g["total_s"]), seconds_text(g["closed_form_total_s"]),
             seconds_text(g["contention_total_s"]), "/".join(g["algorithms"]), g["source"]]
            for g in groups[:COLLECTIVE_GROUPS_SHOWN]]
    calls = sum(g["count"] for g in groups)
    more = (f"<p>... and {len(groups) - COLLECTIVE_GROUPS_SHOWN} more groups (report.json)</p>"
            if len(groups) > COLLECTIVE_GROUPS_SHOWN else "")
    return _table(["kind", "group", "axes", "bytes per call", "calls", "bytes in all", "time in all",
                   "closed form", "contention", "algorithm", "source"], rows) + more + \
        f"<p>{calls} calls in {len(groups)} groups.</p>"


def links_html(mode: dict[str, Any]) -> str:
    links = mode.get("links") or {}
    if not links.get("busiest"):
        return ""
    intro = (f"<p>{links['busy_links']} busy one-way links over the steady-state window of "
             f"{seconds_text(links.get('window_s'))} ({links.get('simulated_links', 0)} simulated, the rest their "
             f"translates by symmetry); the busiest:</p>")
    return intro + _table(["link", "utilisation", "bytes", "simulated"],
                          [[b["link"], percent_text(b["utilisation"]), format_bytes(b["bytes"]),
                            "yes" if b.get("simulated", True) else "by symmetry"] for b in links["busiest"]])


def render_html(report: dict[str, Any], figures: dict[str, Path]) -> str:
    run, chip, modes = report["run"], report["chip"], report["modes"]
    chips = report["slice"]["chips"]
    cards = [("script", run["script"]), ("slice", f"{run['topology']} on {chip['display_name']}"),
             ("chips", str(chips))]
    best = min(modes, key=lambda m: modes[m]["step_time_median_s"]) if modes else None
    summary = modes[best] if best else {"top_ops": [], "collectives": [], "host_stalls": []}
    if best:
        cards += headline_cards(summary, best)
    parts = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>tpusim: "
             f"{html.escape(run['script'])}</title><style>{STYLE}</style></head><body>",
             f"<h1>tpusim cost report: {html.escape(run['script'])}</h1>"]
    reason = incomplete_reason(report)
    if reason:
        traceback = (report.get("error") or {}).get("traceback")
        parts.append(f"<p class='bad'><b>Incomplete:</b> {html.escape(reason)}; the numbers cover what ran "
                     f"before.</p>" + (f"<pre>{html.escape(traceback)}</pre>" if traceback else ""))
    if note := budget_line(report):              # the record budget (TPUSIM_MAX_RECORDS, --max-records)
        parts.append(f"<p class='bad'><b>Recording stopped:</b> {html.escape(note)}</p>")
    if report["slice"].get("shape_note"):
        parts.append(f"<p class='bad'><b>Slice shape:</b> {html.escape(report['slice']['shape_note'])}</p>")
    parts.append("<div class='cards'>" + "".join(f"<div class='card'>{html.escape(k)}<b>{html.escape(str(v))}</b>"
                                                 "</div>" for k, v in cards) + "</div>")
    if best and (summary.get("headline") or {}).get("verdict"):
        parts.append(f"<p class='verdict'><b>Verdict ({html.escape(best)}):</b> "
                     f"{html.escape(summary['headline']['verdict'])}</p>")
    for line in warmup_lines(modes):
        parts.append(f"<p>{html.escape(line)}</p>")
    if report["warnings"]:
        parts.append(_section(f"Warnings ({len(report['warnings'])})", "".join(
            f"<div class='warn'>{html.escape(w['message'])}"
            f"{' (' + html.escape(w['source']) + ')' if w.get('source') else ''}</div>" for w in report["warnings"]),
            open_=True))
    names = list(modes)
    parts.append("<h2>Eager modes</h2>" + _section(
        "every figure per mode (the terminal summary's rows)",
        _table(["", *names], [[label, *values] for label, values in mode_rows(modes, names, recorded_prefix(report))]),
        open_=True))
    if report.get("measured"):
        parts.append(measured_html(report["measured"]))
    for name, title in (("modes", "Step time per mode"), ("breakdown", "Time breakdown"),
                        ("links", "ICI link utilisation"), ("roofline", "Roofline"),
                        ("placements", "Placements")):
        if name in figures:
            parts.append(f"<h2>{title}</h2>" + _image(figures[name], title))
        if name == "links" and best:
            table = links_html(summary)
            if table:
                parts.append(_section(f"Busiest ICI links ({best})", table))
            if summary["collectives"]:
                parts.append(f"<h2>Collectives ({best})</h2>" + _section(
                    "grouped by kind, group, bytes and source line", collective_groups_html(summary), open_=True))
        if name == "placements" and (report.get("placements") or {}).get("ranked"):
            placements = report["placements"]
            parts.append(f"<p>{html.escape(placements.get('reason', ''))}</p>" + _section("Placements, ranked", _table(
                ["placement", "step time", "collective time"],
                [[p["placement"] + (" (default)" if p["placement"] == placements.get("default") else ""),
                  seconds_text(p["step_s"]), seconds_text(p["collective_s"])] for p in placements["ranked"]])))
    if best is None:
        parts.append("<p>No eager mode was priced.</p>")
    else:
        parts.append(f"<h2>Top ops ({best})</h2>" + _section(f"{len(summary['top_ops'])} ops by time", _table(
            ["op", "source", "count", "time", "FLOPs", "bytes", "bound"],
            [[o["op"], o["source"], o["count"], seconds_text(o["seconds"]), f"{o['flops']:.3g}",
              format_bytes(o["bytes"]), o["bound"]] for o in summary["top_ops"]])))
    if summary["host_stalls"]:
        parts.append(f"<h2>Where the host waited ({best})</h2>" + _section("host stalls by source line", _table(
            ["reason", "source", "time"],
            [[s["reason"], s["source"], seconds_text(s["seconds"])] for s in summary["host_stalls"]])))
    parts.append("</body></html>")
    return "\n".join(parts)


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _seconds(value: float | None) -> str:
    return seconds_text(value)


def measured_html(measured: dict[str, Any]) -> str:
    """--target pjrt: real wall time per mode beside the prediction, and the two curves' ratios."""
    base = measured["baseline"]
    why = {"device": "JAX's chip", "--chip": "--chip", "default": "the default chip"}.get(measured["chip_from"], "")
    intro = (f"<p>Each mode run for real through JAX on its {html.escape(measured['platform'])} device "
             f"({html.escape(measured['device_kind'])}, jax {html.escape(measured['jax_version'])}), one fresh "
             f"process per mode, nothing recorded; the prediction is for {html.escape(measured['chip'])} "
             f"({html.escape(why)}). Ratios divide each mode's median step by {html.escape(str(base))}'s.</p>")
    notes = "".join(f"<div class='warn'>{html.escape(note)}</div>" for note in measured["notes"])
    rows = [[m, r["steps"], _seconds(r["first_step_s"]), _seconds(r["step_time_median_s"]),
             _seconds(r["simulated_step_time_median_s"]), _ratio(r["ratio"]["measured"]),
             _ratio(r["ratio"]["simulated"]), _seconds(r["total_s"]),
             f"{r['error']['type']} (exit {r['exit_code']})" if r["error"] else ""]
            for m, r in measured["modes"].items()]
    table = _table(["mode", "steps", "first step", "step (median)", "simulated step", f"vs {base}, measured",
                    f"vs {base}, simulated", "total", "error"], rows)
    errors = "".join(f"<p class='bad'>{html.escape(m)}:</p><pre>{html.escape(r['error']['traceback'] or '')}</pre>"
                     for m, r in measured["modes"].items() if r["error"])
    return "<h2>Measured on the PJRT target</h2>" + intro + notes + table + errors
