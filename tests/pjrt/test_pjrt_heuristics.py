"""Fused eager's cut heuristics on the PJRT target (jax-CPU): each small program really runs in fused
clusters, gives CPU's numbers, and ends the clusters the simulator's fused mode prices for its trace.

The truth: CPU results for numerics; for the cuts, the rule as TorchTPU states it (tests/
test_fused_heuristics.py works the same programs by hand) and ``tpusim.eager.fusion.fuse`` of the trace
recorded while it ran. ``split`` has no case here: torch.tpu.ops' kernels run on the host (no lowering).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import tpusim.backend as tb
from tpusim.backend.targets import pjrt
from tpusim.eager.fusion import fuse
from tpusim.hardware.spec import load_chip


def run_both(program: Callable[[str], torch.Tensor]) -> tuple[dict[str, int], dict[str, int]]:
    """(the PJRT target's cuts, fusion's cuts of the recorded trace) of ``program``, whose result must equal
    CPU's."""
    ref = program("cpu")
    with tb.recording() as rec:
        got = program("tpu")
        pjrt.flush()
    torch.testing.assert_close(got.cpu(), ref)
    return pjrt.stats().cuts, fuse(rec.trace.records, load_chip("v5p")).stats.cuts


def inputs(device: str, n: int = 1) -> list[torch.Tensor]:
    """``n`` vectors copied to ``device`` (a host->device copy fills a fresh buffer: no cut) and added to."""
    g = torch.Generator().manual_seed(3)
    return [torch.rand(64, generator=g).to(device) + 0 for _ in range(n)]


def run_materialized(program: Callable[[str], torch.Tensor]) -> tuple[dict[str, int], dict[str, int]]:
    """(the PJRT cutter's materialized values, fusion's) of ``program``, whose result must equal CPU's."""
    ref = program("cpu")
    with tb.recording() as rec:
        got = program("tpu")
        pjrt.flush()
    torch.testing.assert_close(got.cpu(), ref)
    return dict(pjrt.stats().cutter.materialized), fuse(rec.trace.records, load_chip("v5p")).stats.materialized


def test_fanout_is_an_output_of_the_cluster_not_a_cut(fused: object) -> None:
    def program(device: str) -> torch.Tensor:
        (t,) = inputs(device)
        y = t * 3
        a = y * 2
        b = y - 1                                   # y's second consumer: y is an output, the cluster goes on
        return a + b

    got, model = run_both(program)
    assert got == model and "fanout" not in got and pjrt.stats().windows == 1
    pjrt.reset_stats()
    materialized, model_materialized = run_materialized(program)
    assert materialized == model_materialized and materialized.get("fanout") == 1


def test_a_loop_carried_chain_stays_one_cluster(fused: object) -> None:
    def program(device: str) -> torch.Tensor:
        (h,) = inputs(device)
        h = h * 1.0
        for _ in range(3):
            h = h * 0.5                             # a loop-carried chain: one line, one op, its own result
        return h

    got, model = run_both(program)
    assert got == model and "reexecution" not in got and pjrt.stats().windows == 1


def test_backward_returning_ends_the_cluster(fused: object) -> None:
    def program(device: str) -> torch.Tensor:
        (t,) = inputs(device)
        w = t.clone().requires_grad_()
        ((w * 3).tanh() * 2).sum().backward()       # TorchTPU's autograd post-backward materialization
        return w.grad * 5                           # a cluster after it

    got, model = run_both(program)
    assert got == model and got.get("backward") == 1


def test_stale(fused: object) -> None:
    def program(device: str) -> torch.Tensor:
        (t,) = inputs(device)
        y = t * 3
        a = y * 2
        y.add_(1)                                   # overwrites y, which a read: the old y would be stale
        return a * y

    got, model = run_both(program)
    assert got == model and got.get("stale") == 1


@pytest.mark.filterwarnings("ignore:tpusim pjrt.*nonzero")
def test_dynamic(fused: object) -> None:
    def program(device: str) -> torch.Tensor:
        (t,) = inputs(device)
        y = t - 0.5
        return torch.nonzero(y > 0).float()         # a data-dependent shape: the cluster ends, it runs alone

    got, model = run_both(program)
    assert got == model and got.get("dynamic") == 1


def layer(x: torch.Tensor) -> torch.Tensor:
    """Twelve different elementwise ops in a chain (one "layer")."""
    y = x + 1
    y = y * 2
    y = y - 0.5
    y = y / 3
    y = y.exp()
    y = y.tanh()
    y = y.sigmoid()
    y = y.relu()
    y = -y
    y = y.abs()
    y = y.sqrt()
    return y.log1p()


def test_repeated_layers_compile_one_cluster(fused: object) -> None:
    def program(device: str) -> torch.Tensor:
        ws = inputs(device, 4)
        return torch.stack([layer(w) for w in ws])  # four independent layers: no carried value

    got, model = run_both(program)
    # layers 1+2 (the repeat is seen when layer 2 ends), then layer 3, then layer 4 with the stack
    assert got == model and got.get("repeated") == 3
    pjrt.reset_stats()
    again = program("tpu")                          # again (its result held, as before): every cluster cached
    pjrt.flush()
    assert pjrt.stats().compiles == 0 and pjrt.stats().cuts.get("repeated") == 3 and again.shape[0] == 4
