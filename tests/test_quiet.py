"""Quiet where nothing is wrong (issue 45, item 5): advice said once per machine, no caveat about values a
shape-only run never computed, no progress bar before an error, `tpusim check`'s verdict lines without the cost
table, and a script that raised gets a line, not a cost table of the few ops before its error."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from factories import training_trace

from tpusim.cli.main import main
from tpusim.eager.modes import get_mode
from tpusim.placement.distributed import NO_VALUES, distributed_info
from tpusim.pricing import price
from tpusim.report import RunInfo, build_report, summary_table, write_report
from tpusim.report.lint import lint
from tpusim.report.placements import format_placements
from tpusim.report.summary import verdict_summary
from tpusim.run import notices
from tpusim.slice.topology import build_slice
from tpusim.trace.records import InexactCollective, RanksOne, Trace, TraceMeta

MISSING = "libtpu is not installed; the xla extra (pip install -e \".[xla]\") prices each program as the real TPU"
LINES = ["TPU compiler: not used (libtpu is not installed; the xla extra (pip install -e \".[xla]\") prices each "
         "program as the real TPU compiler builds it)", "placements: none"]


def test_the_missing_extra_is_said_once_per_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert notices.once(LINES[1:], MISSING, "xla") == LINES[1:]      # not said: not remembered as said
    assert notices.once(LINES, MISSING, "xla") == LINES              # the first run says it
    assert notices.once(LINES, MISSING, "xla") == LINES[1:]          # every later run does not
    assert notices.once(LINES, None, "xla") == LINES                 # nothing missing: nothing dropped
    assert (tmp_path / "tpusim" / "notices" / "xla").is_file()


def _ranks_one(numerics: bool) -> Trace:
    inexact = InexactCollective("all_gather", "model.py:7", 2, "exact only if every rank's shard is equal")
    return Trace([], world_size=8, meta=TraceMeta(ranks="one", numerics=numerics,
                                                  ranks_one=RanksOne("symmetry", (inexact,))))


def test_numerics_off_says_nothing_about_values_it_never_computed() -> None:
    s = build_slice("3d:2x2x2")
    assert format_placements(distributed_info(_ranks_one(True), s), None).startswith("--ranks one: values after")
    off = distributed_info(_ranks_one(False), s)
    assert off.not_reference_correct == () and off.numerics_rule == NO_VALUES
    assert format_placements(off, None) == ""


def _report(tmp_path: Path, error: str | None = None):
    trace = training_trace(3)
    s = build_slice("3d:1x1x1", "v5p")
    timelines = {"strict": price(trace, topology=s, mode=get_mode("strict"))}
    info = RunInfo("model.py", error_type=error, error_traceback=error and f"{error}: boom",
                   exit_code=1 if error else 0)
    report = build_report(info, trace, s, timelines, lint(trace, s.chip, timelines["strict"]))
    write_report(tmp_path / "out", report, timelines)
    return report


def test_check_prints_the_verdict_lines_not_the_run_table(tmp_path: Path) -> None:
    report = _report(tmp_path)
    assert len(summary_table(report, "out").splitlines()) > 20           # what `tpusim run` prints
    lines = verdict_summary(report, "out").splitlines()
    assert lines[0].startswith("tpusim: model.py on 3d:1x1x1")
    assert any(line.startswith("verdict (strict): host dispatch-bound") for line in lines)
    assert "2 warnings (host-sync, mxu-padding): in the report; --fail-on CODE gates them" in lines
    assert not any(line.startswith(("whole-program totals:", "warning:", "kernels")) for line in lines)
    assert len(lines) <= 5


def test_a_script_that_raised_gets_a_line_not_a_cost_table(tmp_path: Path) -> None:
    report = _report(tmp_path, "RuntimeError")
    lines = summary_table(report, "out").splitlines()
    assert lines[0].startswith("tpusim: model.py on 3d:1x1x1 raised RuntimeError after 6 ops and 0 collectives")
    assert "INCOMPLETE: the script raised RuntimeError; the report covers what ran before" in lines
    assert len(lines) == 3 and not any("HFU" in line or "kernels" in line for line in lines)


def test_a_sweep_without_dask_says_so_before_any_progress_bar(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    _report(tmp_path)
    monkeypatch.setitem(sys.modules, "distributed", None)             # as if Dask were not installed
    code = main(["sweep", str(tmp_path / "out"), "--topology", "3d:1x1x1,3d:2x2x1", "--out", str(tmp_path / "s")])
    err = capsys.readouterr().err
    assert code == 2 and "tpusim sweep needs Dask" in err
    assert "pricing" not in err and "%|" not in err
