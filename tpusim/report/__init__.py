"""The cost report of a run: report.json (the contract), report.html, PNG figures, trace.json.

``build_report`` (report/model.py) assembles report.json's dict once from a run's typed parts;
``Measured`` is what ``tpusim run --target pjrt`` measured for real (report/measured.py).

``write_report`` writes every file atomically (temporary name, then rename), so a crash
or Ctrl-C never leaves a half-written report.json behind.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tpusim.report.html import render_html
from tpusim.report.measured import Measured, measured_section
from tpusim.report.model import RunInfo, build_report
from tpusim.report.perfetto import perfetto_trace
from tpusim.report.plots import save_figures
from tpusim.report.summary import summary_table
from tpusim.timeline import Timeline

__all__ = ["Measured", "RunInfo", "build_report", "measured_section", "summary_table", "write_report",
           "write_atomic"]


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_report(out_dir: str | Path, report: dict[str, Any], timelines: dict[str, Timeline]) -> Path:
    """Write report.json, the figures, report.html and trace.json (the fastest mode's timeline)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "report.json", json.dumps(report, indent=1, sort_keys=True) + "\n")
    figures = save_figures(report, out)
    write_atomic(out / "report.html", render_html(report, figures))
    if timelines:
        mode = min(timelines, key=lambda m: timelines[m].total_s)
        write_atomic(out / "trace.json", json.dumps(perfetto_trace(timelines[mode], mode)))
    return out
