"""The PJRT target: tpu ops through JAX in the eager mode (Strict and Debug: one jitted computation per op
signature; Fused: tpusim.eager.fusion's windows, tests/pjrt/test_pjrt_windows.py)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from models import ElementwiseMLP, SmallTransformer, mlp_batch, train, transformer_batch

import tpusim
from tpusim.backend.dispatch import debug_mode

MODES = ["strict", "fused"]


@pytest.mark.parametrize("pjrt_mode", ["debug", *MODES], indirect=True)
def test_mlp_trains_with_cpu_losses(pjrt_mode: object) -> None:
    torch.manual_seed(0)
    ref = train(ElementwiseMLP(), mlp_batch(), 3, "cpu")
    torch.manual_seed(0)
    got = train(ElementwiseMLP(), mlp_batch(), 3, "tpu")
    assert got == pytest.approx(ref, rel=1e-5, abs=1e-6)
    stats = pjrt_mode.stats()
    assert stats.ops > 100 and stats.host_ops == 0, pjrt_mode.host_ops()


@pytest.mark.parametrize("pjrt_mode", MODES, indirect=True)
def test_transformer_trains_with_cpu_losses(pjrt_mode: object) -> None:
    torch.manual_seed(0)
    ref = train(SmallTransformer(), transformer_batch(), 2, "cpu")
    torch.manual_seed(0)
    got = train(SmallTransformer(), transformer_batch(), 2, "tpu")
    assert got == pytest.approx(ref, rel=1e-4, abs=1e-5)
    assert pjrt_mode.stats().ops > pjrt_mode.stats().host_ops


@pytest.mark.parametrize("pjrt_mode", ["strict"], indirect=True)
def test_strict_compiles_once_per_op_signature(pjrt_mode: object) -> None:
    x = torch.randn(4, 4, device="tpu")
    for _ in range(3):
        y = x * 2 + 1
    before = pjrt_mode.stats().compiles
    for _ in range(3):
        y = x * 2 + 1
    assert pjrt_mode.stats().compiles == before
    torch.testing.assert_close(y.cpu(), x.cpu() * 2 + 1)


@pytest.mark.parametrize("pjrt_mode", MODES, indirect=True)
def test_inplace_out_and_views_keep_pytorch_semantics(pjrt_mode: object) -> None:
    a = torch.arange(12.0).reshape(3, 4)
    t = a.to("tpu")
    t.mul_(2)                                      # in-place
    t[1].add_(100)                                 # in-place through a view
    col = t[:, 1]                                  # read a view after pending writes
    out = torch.empty(3, device="tpu")
    torch.sum(t, dim=1, out=out)                   # out=
    a.mul_(2)
    a[1].add_(100)
    torch.testing.assert_close(t.cpu(), a)
    torch.testing.assert_close(col.cpu(), a[:, 1])
    torch.testing.assert_close(out.cpu(), a.sum(1))
    assert t.sum().item() == a.sum().item()


@pytest.mark.parametrize("pjrt_mode", ["fused"], indirect=True)
def test_fused_defers_until_a_host_read(pjrt_mode: object) -> None:
    x = torch.randn(64, device="tpu")
    y = (x.sin() * 2 + 1).relu()                       # a chain: no value with two consumers (no fanout cut)
    assert pjrt_mode.stats().executions == 0           # nothing ran yet: one pending window
    got = y.cpu()
    torch.testing.assert_close(got, (x.cpu().sin() * 2 + 1).relu())
    assert pjrt_mode.stats().executions == 1


@pytest.mark.parametrize("pjrt_mode", MODES, indirect=True)
def test_random_ops_draw_what_cpu_draws(pjrt_mode: object) -> None:
    torch.manual_seed(3)
    ref = F.dropout(torch.ones(100), 0.5)
    torch.manual_seed(3)
    got = F.dropout(torch.ones(100, device="tpu"), 0.5)
    torch.testing.assert_close(got.cpu(), ref)


@pytest.mark.parametrize("pjrt_mode", MODES, indirect=True)
def test_ops_without_lowering_fall_back_with_a_warning(pjrt_mode: object, monkeypatch: pytest.MonkeyPatch) -> None:
    from tpusim.backend.lowering import registry

    table = dict(registry.LOWERINGS)
    del table[torch.ops.aten.cos.default]
    monkeypatch.setattr(registry, "LOWERINGS", table)
    monkeypatch.setattr(pjrt_mode._S, "host", {})
    monkeypatch.setattr(pjrt_mode._S, "cache", {})
    x = torch.randn(5, device="tpu")
    with pytest.warns(RuntimeWarning, match="aten.cos.default"):
        y = (x.sin() + 1).cos()
    torch.testing.assert_close(y.cpu(), (x.cpu().sin() + 1).cos())
    assert "aten.cos.default" in pjrt_mode.host_ops()


@pytest.mark.parametrize("pjrt_mode", ["debug"], indirect=True)
def test_debug_mode_checks_each_result_after_jax_ran_it(pjrt_mode: object) -> None:
    x = torch.tensor([1.0, -1.0], device="tpu")
    y = x.exp()                                              # finite: passes the check
    with pytest.raises(debug_mode.TpuNonFiniteError, match="aten::log .*1 NaN"):
        x.log()
    assert pjrt_mode.mode() == "debug" and pjrt_mode.stats().executions == 2
    torch.testing.assert_close(y.cpu(), torch.tensor([1.0, -1.0]).exp())


@pytest.mark.parametrize("pjrt_mode", ["strict"], indirect=True)
def test_the_target_follows_eager_mode_changes(pjrt_mode: object) -> None:
    x = torch.randn(16, device="tpu")
    with tpusim.eager_mode("fused"):
        assert pjrt_mode.mode() == "fused"
        y = x.sin() * 2 + 1
        assert pjrt_mode.stats().executions == 0              # pending in the window
    assert pjrt_mode.mode() == "strict"
    assert pjrt_mode.stats().cuts == {"mode": 1} and pjrt_mode.stats().executions == 1
    torch.testing.assert_close(y.cpu(), x.cpu().sin() * 2 + 1)
    compiles = pjrt_mode.stats().compiles
    with tpusim.eager_mode("fused"):
        y = x.sin() * 2 + 1
    assert pjrt_mode.stats().compiles == compiles              # the window's compile cache outlives a switch
    pjrt_mode.enable()                                       # no name: the eager mode as it is
    assert pjrt_mode.mode() == tpusim.get_eager_mode() == "strict"
    pjrt_mode.enable("fused")                                # a name sets the eager mode
    assert pjrt_mode.mode() == tpusim.get_eager_mode() == "fused"
    with pytest.raises(ValueError, match="accepted: debug, strict, fused"):
        pjrt_mode.enable("lazy")


def test_environment_selects_target_and_mode() -> None:
    code = ("import torch, tpusim.backend; from tpusim.backend.targets import pjrt; x = torch.ones(3, device='tpu'); "
            "y = (x + 1).sum(); print(pjrt.mode(), y.item(), pjrt.stats().windows, pjrt.stats().cuts)")
    env = {**os.environ, "TPUSIM_TARGET": "pjrt", "TPUSIM_EAGER_MODE": "fused"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    assert out.split() == ["fused", "6.0", "1", "{'sync':", "1}"]


@pytest.mark.parametrize("pjrt_mode", MODES, indirect=True)
def test_cached_computations_keep_no_device_memory_alive(pjrt_mode: object) -> None:
    x = torch.randn(1000, device="tpu")
    gc.collect()                                   # what earlier tests left in reference cycles
    base = torch.tpu.memory_allocated()
    y = (x * 3).abs() + 1                          # new signatures: their first arguments must not stay cached
    y.cpu()
    del y
    gc.collect()                                   # a first lowering's make_fx trace leaves reference cycles
    assert torch.tpu.memory_allocated() == base


@pytest.mark.parametrize("pjrt_mode", ["strict", "fused"], indirect=True)
def test_a_new_python_float_reuses_the_compiled_computation(pjrt_mode: object) -> None:
    # An optimizer's step size and bias corrections change every step: compiled with them as
    # constants, every step would recompile (the fused window of a whole AdamW update, too).
    x = torch.randn(64, dtype=torch.bfloat16)
    dev = x.to("tpu")
    compiles = []
    for lr in (0.1, 0.2, 0.3):
        got = dev.mul(lr).add(dev, alpha=lr).cpu()
        torch.testing.assert_close(got, x.mul(lr).add(x, alpha=lr))
        assert got.dtype == torch.bfloat16             # a Python float stays weakly typed
        compiles.append(pjrt_mode.stats().compiles)
    assert compiles[1] == compiles[2]
