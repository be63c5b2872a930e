"""The cost report of a run: report.json (the contract), report.html, PNG figures, trace.json.

``build_report`` (report/model.py) assembles the report once from a run's typed parts: a ``Report``
(report/schema.py), report.json's typed model, whose JSON Schema is written beside it (report.schema.json);
``Measured`` is what ``tpusim run --target pjrt`` measured for real (report/measured.py).

``write_report`` writes every file atomically (a unique temporary name, then one rename:
tpusim/output.py), so a crash, kill -9 or Ctrl-C never leaves a half-written file behind.
``load_report`` (report/load.py) reads a report.json back into a ``Report``, checking its schema and version.
"""

from __future__ import annotations

import json
from pathlib import Path

from tpusim.output import write_atomic
from tpusim.pricing.timeline import Timeline
from tpusim.report.html import render_html
from tpusim.report.load import READ_VERSIONS, load_report
from tpusim.report.measured import Measured, measured_section
from tpusim.report.model import Interrupted, RunInfo, build_report, incomplete_reason
from tpusim.report.perfetto import perfetto_trace
from tpusim.report.schema import Report, json_schema, report_json
from tpusim.report.summary import summary_table

# What a run writes into its report folder (a rerun replaces only those an earlier run listed: tpusim/output.py).
# Adding a file a run writes = one name here.
PRICING_ERROR = "pricing-error.txt"    # where pricing failed, with the traceback (the recording is kept)
RUN_FILES = ("report.json", "report.schema.json", "report.html", "trace.json", "program.jsonl", PRICING_ERROR)
RUN_FOLDERS = ("ranks",)        # --ranks all: each rank's trace


def run_files() -> tuple[str, ...]:
    """Every file name a run writes into its report folder, figures included."""
    from tpusim.report.plots import FIGURES

    return (*RUN_FILES, *(f"{name}.png" for name in FIGURES))


__all__ = ["PRICING_ERROR", "RUN_FILES", "RUN_FOLDERS", "run_files", "READ_VERSIONS", "Interrupted", "Measured",
           "Report", "RunInfo",
           "build_report", "incomplete_reason",
           "json_schema", "load_report", "measured_section", "report_json", "summary_table", "write_atomic",
           "write_report"]


def write_report(out_dir: str | Path, report: Report, timelines: dict[str, Timeline]) -> Path:
    """Write report.json and its JSON Schema (report.schema.json), the figures, report.html and trace.json
    (the fastest mode's timeline)."""
    from tpusim.report.plots import save_figures  # matplotlib: only when figures are drawn

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "report.json", report_json(report))
    write_atomic(out / "report.schema.json", json.dumps(json_schema(), indent=1, sort_keys=True) + "\n")
    figures = save_figures(report, out)
    write_atomic(out / "report.html", render_html(report, figures))
    if timelines:
        mode = min(timelines, key=lambda m: timelines[m].total_s)
        write_atomic(out / "trace.json", json.dumps(perfetto_trace(timelines[mode], mode)))
    return out
