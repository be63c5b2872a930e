"""The table `tpusim run` prints at the end: one column per eager mode."""

from __future__ import annotations

from typing import Any

from tpusim.units import format_bytes, format_seconds


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
        ("collectives exposed", [format_seconds(modes[m]["device_s"]["collective_exposed"]) for m in names]),
        ("MXU utilisation", [f"{modes[m]['mxu_utilisation']:.1%}" for m in names]),
        ("MFU", [f"{modes[m]['mfu']:.1%}" for m in names]),
        ("HBM peak", [f"{format_bytes(modes[m]['hbm']['peak_bytes'])} "
                      f"({modes[m]['hbm']['peak_fraction']:.1%})" for m in names]),
    ]
    label_width = max(len(label) for label, _ in rows)
    widths = [max(len(m), *(len(values[i]) for _, values in rows)) for i, m in enumerate(names)]
    program = report["program"]
    lines = [f"tpusim: {run['script']} on {run['topology']} ({report['chip']['display_name']}, "
             f"{report['slice']['chips']} chips) - {program['ops']} ops, {program['collectives']} collectives, "
             f"{program['steps']} steps",
             " " * label_width + "  " + "  ".join(m.rjust(w) for m, w in zip(names, widths))]
    lines += [label.ljust(label_width) + "  " + "  ".join(v.rjust(w) for v, w in zip(values, widths))
              for label, values in rows]
    for warning in report["warnings"]:
        lines.append(f"warning: {warning['message']}" + (f" ({warning['source']})" if warning.get("source") else ""))
    if not report["complete"]:
        lines.append(f"INCOMPLETE: the script raised {report['error']['type']}; the report covers what ran before")
    lines.append(f"report: {out_dir}/report.html (report.json, trace.json for ui.perfetto.dev)")
    return "\n".join(lines)
