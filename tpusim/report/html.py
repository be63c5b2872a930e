"""report.html: one self-contained page (figures embedded as base64 PNG) that opens offline."""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any

from tpusim.report.model import incomplete_reason
from tpusim.units import format_bytes, format_seconds

STYLE = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:2em;border-bottom:1px solid #ddd}
.cards{display:flex;flex-wrap:wrap;gap:1em}.card{border:1px solid #ddd;border-radius:6px;padding:.7em 1em}
.card b{display:block;font-size:1.3em}.bad{color:#b00}table{border-collapse:collapse;font-size:.85em}
td,th{border-bottom:1px solid #eee;padding:.25em .6em;text-align:right}td:first-child,th:first-child{text-align:left}
img{max-width:100%}.warn{background:#fff4e5;padding:.4em .8em;border-left:4px solid #f0a020;margin:.3em 0}
pre{background:#f6f6f6;padding:1em;overflow:auto}
"""


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _image(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<p><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}"></p>'


def render_html(report: dict[str, Any], figures: dict[str, Path]) -> str:
    run, chip, modes = report["run"], report["chip"], report["modes"]
    cards = [("script", run["script"]), ("slice", f"{run['topology']} on {chip['display_name']}"),
             ("chips", report["slice"]["chips"])]
    best = min(modes, key=lambda m: modes[m]["step_time_median_s"]) if modes else None
    summary = modes[best] if best else {"top_ops": [], "collectives": [], "host_stalls": []}
    if best:
        cards += [("step time", format_seconds(summary["step_time_median_s"]) + f" ({best})"),
                  ("MFU", f"{summary['mfu']:.1%}"),
                  ("HBM peak", f"{format_bytes(summary['hbm']['peak_bytes'])} "
                               f"of {format_bytes(summary['hbm']['capacity_bytes'])}")]
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>tpusim: {html.escape(run['script'])}"
             f"</title><style>{STYLE}</style></head><body>",
             f"<h1>tpusim cost report: {html.escape(run['script'])}</h1>"]
    reason = incomplete_reason(report)
    if reason:
        traceback = (report.get("error") or {}).get("traceback")
        parts.append(f"<p class='bad'><b>Incomplete:</b> {html.escape(reason)}; the numbers cover what ran "
                     f"before.</p>" + (f"<pre>{html.escape(traceback)}</pre>" if traceback else ""))
    parts.append("<div class='cards'>" + "".join(f"<div class='card'>{html.escape(k)}<b>{html.escape(str(v))}</b>"
                                                 "</div>" for k, v in cards) + "</div>")
    for warning in report["warnings"]:
        parts.append(f"<div class='warn'>{html.escape(warning['message'])}"
                     f"{' (' + html.escape(warning['source']) + ')' if warning.get('source') else ''}</div>")
    parts.append("<h2>Eager modes</h2>" + _table(
        ["mode", "step (median)", "first step", "total", "kernels", "host stall", "MXU util", "MFU"],
        [[m, format_seconds(r["step_time_median_s"]), format_seconds(r["first_step_s"] or 0),
          format_seconds(r["total_s"]), r["kernels"], format_seconds(r["host_s"]["stall"]),
          f"{r['mxu_utilisation']:.1%}", f"{r['mfu']:.1%}"] for m, r in modes.items()]))
    if report.get("measured"):
        parts.append(measured_html(report["measured"]))
    for name, title in (("modes", "Step time per mode"), ("breakdown", "Time breakdown"),
                        ("roofline", "Roofline"), ("links", "ICI link utilisation"),
                        ("placements", "Placements")):
        if name in figures:
            parts.append(f"<h2>{title}</h2>" + _image(figures[name], title))
        if name == "placements" and (report.get("placements") or {}).get("ranked"):
            placements = report["placements"]
            parts.append(f"<p>{html.escape(placements.get('reason', ''))}</p>" + _table(
                ["placement", "step time", "collective time"],
                [[p["placement"] + (" (default)" if p["placement"] == placements.get("default") else ""),
                  format_seconds(p["step_s"]), format_seconds(p["collective_s"])] for p in placements["ranked"]]))
    if best is None:
        parts.append("<p>No eager mode was priced.</p>")
    else:
        parts.append(f"<h2>Top ops ({best})</h2>" + _table(
            ["op", "source", "count", "time", "FLOPs", "bytes", "bound"],
            [[o["op"], o["source"], o["count"], format_seconds(o["seconds"]), f"{o['flops']:.3g}",
              format_bytes(o["bytes"]), o["bound"]] for o in summary["top_ops"]]))
    if summary["collectives"]:
        parts.append(f"<h2>Collectives ({best})</h2>" + _table(
            ["kind", "bytes", "group", "axes", "algorithm", "DES time", "closed form", "contention", "source"],
            [[c["kind"], format_bytes(c["bytes"]), c["group_size"], ",".join(c["axes"]), c["algorithm"],
              format_seconds(c["time_s"]), format_seconds(c["closed_form_s"]),
              format_seconds(max(0.0, c["contention_s"])), c["source"]]
             for c in summary["collectives"][:50]]))
    if summary["host_stalls"]:
        parts.append(f"<h2>Where the host waited ({best})</h2>" + _table(
            ["reason", "source", "time"],
            [[s["reason"], s["source"], format_seconds(s["seconds"])] for s in summary["host_stalls"]]))
    parts.append("</body></html>")
    return "\n".join(parts)


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _seconds(value: float | None) -> str:
    return "-" if value is None else format_seconds(value)


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
