"""The record budget (issue 17, row 9): a long run's recording stops at a step boundary once the budget is
reached, the script runs on with exact numerics, and the report prices the recorded steps and says so."""

from __future__ import annotations

import gc
import html
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from factories import sgd_steps, train_linear
from torch import nn

import tpusim.backend as tb
from tpusim import envvars
from tpusim.backend.plumbing.state import STATE
from tpusim.backend.program_trace import recorder
from tpusim.errors import TpusimError
from tpusim.trace.records import StepMarker

ROOT = Path(__file__).resolve().parents[2]
STEPS = 6


def _train(device: str, steps: int = STEPS) -> nn.Module:
    """A few SGD steps of a small MLP on ``device``, from the same seed each time."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4)).to(device)
    return sgd_steps(model, torch.randn(32, 8).to(device), steps)


def test_budget_stops_at_the_first_step_boundary_past_it_and_the_script_runs_on_exactly() -> None:
    # earlier tests' garbage freed by a GC pass inside one recording and not the other would add free records
    # to one of the two: collect it first, so both record the same program
    gc.collect()
    with tb.recording(max_records=0) as whole:                 # the independent truth: no budget
        _train("tpu")
    gc.collect()
    markers = [r for r in whole.trace.records if isinstance(r, StepMarker)]
    assert len(markers) == STEPS and whole.stopped_after_step is None
    budget = markers[1].seq                                    # reached inside step 2: stops at its end
    with tb.recording(max_records=budget) as cut:
        model = _train("tpu")
    assert cut.stopped_after_step == 2 and cut.steps == STEPS  # steps after the stop are still counted
    records = cut.trace.records
    assert len(records) == markers[1].seq + 1 and isinstance(records[-1], StepMarker)
    assert [type(r) for r in records] == [type(r) for r in whole.trace.records[:len(records)]]
    reference = _train("cpu")                                  # outside any recording (CPU optimizers mark steps)
    for mine, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(mine.detach().cpu(), theirs.detach())
    assert STATE.recording is False
    with tb.recording(max_records=0) as again:                 # a stopped recording leaves nothing behind
        _train("tpu", 1)
    assert again.steps == 1 and len(again.trace.records) > 0


def test_budget_reached_exactly_at_a_step_end_stops_there() -> None:
    with tb.recording(max_records=0) as whole:
        _train("tpu", 3)
    first = next(r for r in whole.trace.records if isinstance(r, StepMarker))
    with tb.recording(max_records=first.seq + 1) as cut:       # the marker itself is the budget's last record
        _train("tpu", 3)
    assert cut.stopped_after_step == 1 and cut.steps == 3 and len(cut.trace.records) == first.seq + 1


def test_budget_comes_from_the_environment_and_bad_values_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TPUSIM_MAX_RECORDS", "1e2")      # above one step's records: a budget below them stops
    with tb.recording() as rec:                          # before the first step (test_record_budget_nostep.py)
        _train("tpu", 3)
    assert rec.max_records == 100 and rec.stopped_after_step == 2
    monkeypatch.delenv("TPUSIM_MAX_RECORDS")
    assert envvars.read("TPUSIM_MAX_RECORDS") == envvars.MAX_RECORDS_DEFAULT
    for bad in ("lots", "-5", "1.5", "1e400"):
        with pytest.raises(TpusimError, match="TPUSIM_MAX_RECORDS=.*accepted: a whole number of records"):
            envvars.read("TPUSIM_MAX_RECORDS", {"TPUSIM_MAX_RECORDS": bad})


def test_note_names_the_step_the_total_and_how_to_raise_it() -> None:
    note = recorder.budget_note(2, 6, 1_000_000)
    assert note.startswith("recording stopped after step 2 of 6 (record budget 1,000,000 records")
    assert "TPUSIM_MAX_RECORDS" in note and "--max-records" in note


SCRIPT = """import torch
from torch import nn
torch.manual_seed(0)
model = nn.Linear(8, 4).to("tpu")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(16, 8).to("tpu")
for _ in range(5):
    opt.zero_grad(); model(x).square().mean().backward(); opt.step()
print("weight sum", repr(model.weight.sum().item()))
"""


def test_tpusim_run_prices_the_recorded_steps_and_says_where_it_stopped(tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, "-m", "tpusim", "run", str(path), "--quiet", "--max-records", "60",
                             "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    report = json.loads((out / "report.json").read_text())
    stopped = report["recording_stopped"]
    assert stopped["steps"] == 5 and stopped["max_records"] == 60 and 1 <= stopped["after_step"] < 5
    assert stopped["note"].startswith(f"recording stopped after step {stopped['after_step']} of 5")
    assert report["program"]["steps"] == stopped["after_step"]
    assert report["modes"]["strict"]["steps"]["count"] == stopped["after_step"]
    assert f"note: {stopped['note']}" in result.stdout
    assert stopped["note"] in html.unescape((out / "report.html").read_text())
    model = train_linear("cpu", 5)                            # the script's last value, as CPU computes it
    assert f"weight sum {model.weight.sum().item()!r}" in result.stdout


def test_max_records_flag_is_checked_before_anything_runs(tmp_path: Path) -> None:
    path, ran = tmp_path / "never.py", tmp_path / "ran"
    path.write_text(f"open({str(ran)!r}, 'w').close()\n")
    result = subprocess.run([sys.executable, "-m", "tpusim", "run", str(path), "--max-records", "many"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "--max-records" in result.stderr and "'many'" in result.stderr
    assert "Traceback" not in result.stderr and not ran.exists()
