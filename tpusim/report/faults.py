"""The faulted slice against the healthy one: report.json's ``faults`` section and its terminal lines.

A faulted run is priced twice, on ``slice_`` and on ``slice_.healthy``; this module sets the two side by side.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tpusim.pricing.timeline import step_stats
from tpusim.slice.faults import describe
from tpusim.slice.topology import Slice
from tpusim.units import format_seconds


def slowdown_section(slice_: Slice, faulted: Mapping[str, Any], healthy: Mapping[str, Any]) -> dict[str, Any]:
    """report.json's ``faults`` section: what failed, and per mode the healthy and faulted step time
    (median after the first step) and whole program, with the ratio faulted / healthy. ``faulted``
    and ``healthy`` map a mode to its ``Timeline`` on ``slice_`` and on ``slice_.healthy``."""
    modes = {}
    for mode, timeline in faulted.items():
        base = healthy[mode]
        step = step_stats([s.seconds for s in timeline.steps], timeline.total_s).median_s
        step0 = step_stats([s.seconds for s in base.steps], base.total_s).median_s
        modes[mode] = {"step_time_median_s": step, "healthy_step_time_median_s": step0,
                       "total_s": timeline.total_s, "healthy_total_s": base.total_s,
                       "slowdown": step / step0 if step0 else None}
    return {**slice_.faults_dict(), "description": describe(slice_), "modes": modes}


def slowdown_lines(section: Mapping[str, Any] | None) -> list[str]:
    """The terminal summary's lines for a faulted run (none for a healthy one)."""
    if not section:
        return []
    lines = [f"faults: {section['description']}"]
    for mode, m in section["modes"].items():
        ratio = f"{m['slowdown']:.3g}x" if m["slowdown"] is not None else "-"
        lines.append(f"  {mode}: step {format_seconds(m['step_time_median_s'])} vs "
                     f"{format_seconds(m['healthy_step_time_median_s'])} on the healthy slice ({ratio})")
    return lines
