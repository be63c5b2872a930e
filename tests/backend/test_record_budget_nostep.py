"""The record budget for a recording with no step marked yet (tpusim/backend/program_trace/recorder.py): it stops at
exactly the budget, while the script runs (ops the shim runs natively never call Python: a watcher thread drains the
log), the script runs on with exact numerics, and the report says it priced a prefix of the program."""

from __future__ import annotations

import html
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch
from factories import sgd_steps, train_linear
from torch import nn

import tpusim.backend as tb
from tpusim.backend.plumbing.state import STATE
from tpusim.backend.program_trace import recorder
from tpusim.trace.records import StepMarker

ROOT = Path(__file__).resolve().parents[2]
BUDGET = 200


def _infer(device: str, rounds: int = 60) -> torch.Tensor:
    """An inference loop that marks no step (no optimizer, no tpusim.backend.step()), same seed each time."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4)).to(device)
    x = torch.randn(32, 8).to(device)
    with torch.no_grad():
        for _ in range(rounds):
            x = x + 0.01 * model(x).sum(dim=1, keepdim=True)
    return x


def _shape(records: tuple) -> list[tuple[type, object]]:
    return [(type(r), getattr(r, "op", getattr(r, "event", None))) for r in records]


def test_no_step_recording_keeps_exactly_the_budget_as_the_programs_prefix_and_runs_on_exactly() -> None:
    with tb.recording(max_records=0) as whole:                # the independent truth: no budget
        _infer("tpu")
    assert whole.steps == 0 and len(whole.trace.records) > 3 * BUDGET
    with tb.recording(max_records=BUDGET) as cut:
        out = _infer("tpu")
    assert cut.stopped_after_step == 0 and cut.steps == 0 and cut.kept == BUDGET
    assert _shape(cut.trace.records) == _shape(whole.trace.records[:BUDGET])
    assert [r.seq for r in cut.trace.records] == list(range(BUDGET))
    assert torch.equal(out.cpu(), _infer("cpu"))
    assert STATE.recording is False
    with tb.recording(max_records=0) as again:                # a stopped recording leaves nothing behind
        _infer("tpu", 2)
    assert again.stopped_after_step is None and len(again.trace.records) > 0


def test_a_loop_of_native_ops_is_stopped_while_it_runs_not_at_the_end() -> None:
    stopped_on: list[str] = []
    real_stop = recorder._stop_storing

    def spy(rec: recorder.Recording, kept: int) -> None:
        stopped_on.append(threading.current_thread().name)
        real_stop(rec, kept)

    recorder._stop_storing = spy
    try:
        x = torch.ones(64, device="tpu")
        with tb.recording(max_records=BUDGET) as rec:
            deadline, rounds = time.monotonic() + 20, 0
            while rec.stopped_after_step is None and time.monotonic() < deadline:
                x = x * 1.0 + 1.0                            # the shim's C++ fallback: no Python call per op
                rounds += 1
            assert rec.stopped_after_step == 0              # before the block's end: the log stays bounded
            for _ in range(500):
                x = x * 1.0 + 1.0
            assert len(rec.records) == BUDGET
    finally:
        recorder._stop_storing = real_stop
    assert stopped_on == ["tpusim-record-budget"] and len(rec.trace.records) == BUDGET
    assert torch.equal(x.cpu(), torch.full((64,), 1.0 + rounds + 500))       # every op ran, before and after


def test_steps_marked_after_the_budget_stopped_a_long_first_step_are_counted_and_said() -> None:
    torch.manual_seed(0)
    model = nn.Linear(8, 4).to("tpu")
    x = torch.randn(16, 8).to("tpu")
    with tb.recording(max_records=10) as rec:                # one step makes about 30 records
        sgd_steps(model, x, 3)
    assert rec.stopped_after_step == 0 and rec.steps == 3 and len(rec.trace.records) == 10
    assert not any(isinstance(r, StepMarker) for r in rec.trace.records)
    ref = train_linear("cpu", 3)                              # the same three steps on CPU
    assert torch.equal(model.weight.detach().cpu(), ref.weight.detach())
    note = recorder.budget_note(0, 3, 10, 10)
    assert note.startswith("recording stopped after 10 records (before the first of the 3 steps the script marked")
    assert "not the whole program" in note and "TPUSIM_MAX_RECORDS" in note and "--max-records" in note


SCRIPT = """import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).to("tpu")
x = torch.randn(32, 8).to("tpu")
with torch.no_grad():
    for _ in range(300):
        x = x + 0.01 * model(x).sum(dim=1, keepdim=True)
print("result", repr(x.sum().item()))
"""


def test_tpusim_run_of_a_script_without_steps_reports_the_partial_program(tmp_path: Path) -> None:
    path, out = tmp_path / "infer.py", tmp_path / "out"
    path.write_text(SCRIPT)
    result = subprocess.run([sys.executable, "-m", "tpusim", "run", str(path), "--quiet", "--max-records", str(BUDGET),
                             "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    note = (f"recording stopped after {BUDGET} records (the script marks no steps: the report prices the program's "
            f"first {BUDGET} records, not the whole program; record budget {BUDGET} records; raise it with "
            f"TPUSIM_MAX_RECORDS or tpusim run --max-records, 0 for no limit)")
    assert f"tpusim: recording stopped after {BUDGET} records (no step marked yet" in result.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["recording_stopped"] == {"after_step": 0, "steps": 0, "records": BUDGET, "max_records": BUDGET,
                                           "note": note, "ranks": []}
    assert report["program"]["steps"] == 0 and report["complete"] is True
    assert sum(1 for _ in (out / "program.jsonl").open()) == BUDGET + 1          # a header, then the prefix
    assert f"note: {note}; the figures are the recorded prefix's, not the whole program's" in result.stdout
    assert "whole program (partial)" in result.stdout
    assert "no steps marked, so over the recorded start of the program (the record budget stopped it)" in result.stdout
    page = (out / "report.html").read_text()
    assert note in html.unescape(page) and "whole program (partial)" in page
    assert f"result {_infer('cpu', 300).sum().item()!r}" in result.stdout     # the script ran on, exactly
