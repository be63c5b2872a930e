"""Eager modes on the device (tpusim/eager/state.py, tpusim/backend/dispatch/debug_mode.py): selecting a mode, debug's
NaN/Inf check at the op, the mode change in the trace, identical numerics in every mode."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

import tpusim
import tpusim.backend as tb
from tpusim.backend.dispatch import debug_mode
from tpusim.eager import state as eager
from tpusim.errors import TpusimError
from tpusim.trace.records import HostRecord

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _strict() -> Iterator[None]:
    tpusim.set_eager_mode("strict")
    yield
    tpusim.set_eager_mode("strict")
    debug_mode.configure(check=True, log=False)


def test_select_a_mode() -> None:
    assert tpusim.get_eager_mode() == torch.tpu.get_eager_mode() == "strict"
    assert tpusim.set_eager_mode("Fused") == "strict"           # returns the previous mode
    assert torch.tpu.get_eager_mode() == "fused"
    with tpusim.eager_mode("debug") as mode:
        assert mode == tpusim.get_eager_mode() == "debug"
    assert tpusim.get_eager_mode() == "fused"
    with pytest.raises(ZeroDivisionError), tpusim.eager_mode("debug"):
        _ = 1 / 0
    assert tpusim.get_eager_mode() == "fused"                    # restored on error too


def test_unknown_mode_names_the_accepted_ones() -> None:
    with pytest.raises(TpusimError, match="unknown eager mode 'lazy'; accepted: debug, strict, fused"):
        tpusim.set_eager_mode("lazy")
    assert tpusim.get_eager_mode() == "strict"


def test_environment_sets_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(eager, "_mode", None)
    monkeypatch.setenv("TPUSIM_EAGER_MODE", "debug")
    assert tpusim.get_eager_mode() == "debug"
    monkeypatch.setattr(eager, "_mode", None)
    monkeypatch.setenv("TPUSIM_EAGER_MODE", "eventually")
    with pytest.raises(TpusimError, match="TPUSIM_EAGER_MODE; accepted: debug, strict, fused"):
        tpusim.get_eager_mode()
    monkeypatch.setattr(eager, "_mode", None)
    monkeypatch.delenv("TPUSIM_EAGER_MODE")
    assert tpusim.get_eager_mode() == "strict"


def test_import_tpusim_stays_light() -> None:
    code = ("import sys, tpusim; print('tpusim.eager.state' in sys.modules); "
            "print(tpusim.get_eager_mode(), 'tpusim.eager.state' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "strict", "True", "False"]


def test_a_mode_change_is_a_window_boundary_in_the_trace() -> None:
    x = torch.ones(4, device="tpu")
    with tb.recording() as rec:
        x + 1
        with tpusim.eager_mode("fused"):
            x * 2
        tpusim.set_eager_mode("strict")                          # no change: no record
    hosts = [(h.event, h.reason, h.seconds) for h in rec.trace.of_kind(HostRecord)]
    assert hosts == [("dispatch", "eager_mode:fused", 0.0), ("dispatch", "eager_mode:strict", 0.0)]
    assert rec.trace.meta.eager_mode == "strict"


def test_debug_raises_at_the_op_that_made_a_nan() -> None:
    x = torch.tensor([0.0, 1.0, -1.0], device="tpu")
    x.log()                                                      # strict: no check
    tpusim.set_eager_mode("debug")
    line = sys._getframe().f_lineno + 2
    with pytest.raises(tb.TpuNonFiniteError) as err:
        x.log()
    text = str(err.value)
    assert f"aten::log at test_tpu_eager_modes.py:{line}" in text
    assert "output 0 ([3] float32) has 1 NaN and 1 Inf of 3" in text and "inputs: [3] float32" in text
    y = x.clone()
    with pytest.raises(tb.TpuNonFiniteError, match="aten::div"):
        y.div_(0.0)                                              # in place: checked after the op too
    debug_mode.configure(check=False)
    x.log()                                                      # the knob turns it off


def test_debug_does_not_blame_propagation_or_a_given_inf() -> None:
    tpusim.set_eager_mode("debug")
    scores = torch.randn(2, 4, device="tpu")
    mask = torch.tensor([[False, True, True, True], [False, False, True, True]], device="tpu")
    probs = scores.masked_fill(mask, float("-inf")).softmax(-1)  # -inf given, softmax of it is finite
    assert torch.isfinite(probs).all().item()
    bad = torch.tensor([float("nan"), 1.0]).to("tpu")             # a NaN from the host: propagated, not made
    (bad * 2).sum()
    inf = torch.full((3,), float("inf"), device="tpu")
    inf.add_(1)


def test_debug_log_prints_one_line_per_op(capsys: pytest.CaptureFixture) -> None:
    a = torch.randn(2, 3, device="tpu")
    debug_mode.configure(log=True)
    a.relu()                                                     # strict: no log
    with tpusim.eager_mode("debug"):
        (a @ a.T).relu()
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("tpusim debug:")]
    assert len(lines) == 2
    assert lines[0].startswith("tpusim debug: aten::mm ([2, 3] float32, [3, 2] float32) -> ([2, 2] float32) at "
                               "test_tpu_eager_modes.py:")


def _train_mlp(mode: str) -> tuple[list[float], list[torch.Tensor]]:
    tpusim.set_eager_mode(mode)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4)).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = torch.randn(64, 16, device="tpu"), torch.randn(64, 4, device="tpu")
    losses = []
    for _ in range(4):
        loss = nn.functional.mse_loss(model(torch.nn.functional.dropout(x, 0.1)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in model.parameters()]


def test_numerics_are_identical_in_every_mode() -> None:
    runs = {mode: _train_mlp(mode) for mode in eager.MODES}
    losses, params = runs["strict"]
    assert losses[-1] < losses[0]
    for mode in ("debug", "fused"):
        assert runs[mode][0] == losses, mode                     # bit for bit
        assert all(torch.equal(a, b) for a, b in zip(runs[mode][1], params))


def test_tpusim_run_mode_debug_stops_the_script_at_the_op(tmp_path: Path) -> None:
    script = tmp_path / "nan.py"
    script.write_text("import torch\n"
                      "import tpusim\n"
                      "print('mode', tpusim.get_eager_mode())\n"
                      "x = torch.zeros(3, device='tpu')\n"
                      "y = x / x\n"
                      "print('not reached')\n")
    result = subprocess.run([sys.executable, "-m", "tpusim", "run", str(script), "--mode", "debug", "--quiet",
                             "--out", str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stderr[-2000:]
    assert "mode debug" in result.stdout and "not reached" not in result.stdout
    assert "TpuNonFiniteError: tpusim debug mode: aten::div at nan.py:5" in result.stderr
