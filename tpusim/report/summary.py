"""The table `tpusim run` prints at the end: one column per eager mode, then recompiles by source line."""

from __future__ import annotations

from typing import Any

from tpusim.report.model import incomplete_reason
from tpusim.units import format_bytes, format_seconds

RECOMPILES_SHOWN = 5


def _cache(mode: dict[str, Any]) -> dict[str, Any]:
    """A mode's compile-cache entry; reports written before the cache existed have none."""
    return mode.get("compile_cache") or {"hits": 0, "misses": 0, "recompile_count": 0, "recompiles": []}


def summary_table(report: dict[str, Any], out_dir: str) -> str:
    run, modes = report["run"], report["modes"]
    names = list(modes)
    rows: list[tuple[str, list[str]]] = [
        ("step time (median)", [format_seconds(modes[m]["step_time_median_s"]) for m in names]),
        ("first step", [format_seconds(modes[m]["first_step_s"] or 0.0) for m in names]),
        ("whole program", [format_seconds(modes[m]["total_s"]) for m in names]),
        ("kernels", [str(modes[m]["kernels"]) for m in names]),
        ("host dispatch", [format_seconds(modes[m]["host_s"]["dispatch"]) for m in names]),
        ("host stall", [format_seconds(modes[m]["host_s"]["stall"]) for m in names]),
        ("host compile", [format_seconds(modes[m]["host_s"].get("compile", 0.0)) for m in names]),
        ("compile hits/misses", [f"{_cache(modes[m])['hits']}/{_cache(modes[m])['misses']}" for m in names]),
        ("recompiles", [str(_cache(modes[m])["recompile_count"]) for m in names]),
        ("HBM bytes moved", [format_bytes(modes[m].get("hbm_bytes_moved", 0)) for m in names]),
        ("collectives exposed", [format_seconds(modes[m]["device_s"]["collective_exposed"]) for m in names]),
        ("MXU utilisation", [f"{modes[m]['mxu_utilisation']:.1%}" for m in names]),
        ("MFU", [f"{modes[m]['mfu']:.1%}" for m in names]),
        ("HBM peak", [f"{format_bytes(modes[m]['hbm']['peak_bytes'])} "
                      f"({modes[m]['hbm']['peak_fraction']:.1%})" for m in names]),
    ]
    program = report["program"]
    lines = [f"tpusim: {run['script']} on {run['topology']} ({report['chip']['display_name']}, "
             f"{report['slice']['chips']} chips) - {program['ops']} ops, {program['collectives']} collectives, "
             f"{program['steps']} steps"]
    lines += _columns(names, rows) if names else ["no eager mode was priced"]
    lines += recompile_lines(modes)
    for warning in report["warnings"]:
        lines.append(f"warning: {warning['message']}" + (f" ({warning['source']})" if warning.get("source") else ""))
    reason = incomplete_reason(report)
    if reason:
        lines.append(f"INCOMPLETE: {reason}; the report covers what ran before")
    lines += measured_lines(report)
    lines.append(f"report: {out_dir}/report.html (report.json, trace.json for ui.perfetto.dev)")
    return "\n".join(lines)


def _columns(names: list[str], rows: list[tuple[str, list[str]]], title: str = "") -> list[str]:
    """A header of column names, then one line per row: labels left, values right-aligned under them."""
    label_width = max(len(title), *(len(label) for label, _ in rows))
    widths = [max(len(m), *(len(values[i]) for _, values in rows)) for i, m in enumerate(names)]
    lines = [title.ljust(label_width) + "  " + "  ".join(m.rjust(w) for m, w in zip(names, widths))]
    return lines + [label.ljust(label_width) + "  " + "  ".join(v.rjust(w) for v, w in zip(values, widths))
                    for label, values in rows]


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def measured_lines(report: dict[str, Any]) -> list[str]:
    """--target pjrt: the real wall times per mode and the ratios measured vs simulated (none otherwise)."""
    measured = report.get("measured")
    if not measured:
        return []
    modes = measured["modes"]
    names = list(modes)
    base = measured["baseline"]
    lines = [f"measured: each mode run for real on JAX's {measured['device_kind']} ({measured['platform']}), "
             f"wall time; the prediction above is for {measured['chip']}"]
    if names:
        rows: list[tuple[str, list[str]]] = [
            ("step time (median)", [_seconds(modes[m]["step_time_median_s"]) for m in names]),
            ("simulated (median)", [_seconds(modes[m]["simulated_step_time_median_s"]) for m in names]),
            ("first step", [_seconds(modes[m]["first_step_s"]) for m in names]),
            ("whole program", [_seconds(modes[m]["total_s"]) for m in names]),
            ("steps", [str(modes[m]["steps"]) for m in names]),
            (f"vs {base}, measured", [_ratio(modes[m]["ratio"]["measured"]) for m in names]),
            (f"vs {base}, simulated", [_ratio(modes[m]["ratio"]["simulated"]) for m in names]),
        ]
        lines += _columns(names, rows)
    for name, mode in modes.items():
        if mode["error"]:
            lines.append(f"measured {name}: the run failed with {mode['error']['type']} (exit code "
                         f"{mode['exit_code']}); report.json measured.modes.{name}.error")
    lines += [f"note: {note}" for note in measured["notes"]]
    return lines


def _seconds(value: float | None) -> str:
    return "-" if value is None else format_seconds(value)


def recompile_lines(modes: dict[str, Any]) -> list[str]:
    """One line per distinct recompile (source, op, shapes), naming the modes that hit it."""
    seen: dict[tuple, list[str]] = {}
    for name, mode in modes.items():
        for r in _cache(mode)["recompiles"]:
            key = (r["source"] or "no source", r["op"], str(r["old_shapes"]), str(r["new_shapes"]))
            seen.setdefault(key, []).append(name)
    lines = [f"recompile: {src}: {op} {old} -> {new} ({', '.join(names)})"
             for (src, op, old, new), names in list(seen.items())[:RECOMPILES_SHOWN]]
    if len(seen) > RECOMPILES_SHOWN:
        lines.append(f"... and {len(seen) - RECOMPILES_SHOWN} more recompiles (report.json modes.*.compile_cache)")
    return lines
