"""Fused windows on the PJRT target are tpusim.eager.fusion's windows: a program run here in fused mode while
recording ends as many windows, for the same reasons, as ``fuse(trace.records, chip)`` prices.

The independent truth is the simulator's model (tpusim/eager/fusion.py) applied to the trace the device
recorded; the PJRT side counts its own cuts as it runs (tpusim/backend/targets/pjrt_fused.py). No
difference remains for these programs. The one that did: ``ElementwiseMLP`` calls ``abs``, whose
composite kernel hands the fallback ``abs.out`` with an empty out= tensor; resized on the host, the
fallback would copy it to fresh device memory right after the op, so it could not wait in the
window. ``pjrt_fused.grow`` resizes it in device memory instead; the second test pins that down.
Both sides feed the same ``tpusim.eager.windows.WindowCutter``; the PJRT-only cuts (``pjrt_fused.OWN_CUTS``)
stay absent from both programs. What this target
cannot see, ``tpusim.backend.step()`` and ``torch.tpu.synchronize()`` (no hook; neither needs a
flush), is the one documented difference left: a test pins it to exactly those cuts.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from models import ElementwiseMLP, mlp_batch, train
from torch import nn

import tpusim.backend as tb
from tpusim.backend.targets import pjrt
from tpusim.backend.targets.pjrt_fused import OWN_CUTS
from tpusim.eager.fusion import FusionStats, fuse
from tpusim.eager.windows import CUTS
from tpusim.hardware.spec import load_chip

STEPS = 3
TAIL = 300                       # elementwise pairs after training: a loop-carried chain


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def program(device: str) -> tuple[list[float], torch.Tensor]:
    """A few training steps touching every cut an eager one-process program makes (collectives and
    compiled graphs: tests below): host->device copies with work pending (no cut: a fresh buffer),
    backward() returning (backward: the .item() after it finds nothing pending), momentum buffers cloned on
    the first step (a device copy: deferred), optimizer.step() (step), topk (deferred); then a long
    loop-carried elementwise tail (a mul+add pair repeated: the repeat detector ends it every 10 ops)."""
    torch.manual_seed(0)
    model = MLP().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(STEPS):
        x = torch.randn(16, 32, generator=data).to(device)
        opt.zero_grad(set_to_none=True)
        out = model(x)
        y = torch.randint(0, 10, (16,), generator=data).to(device)
        loss = F.cross_entropy(out, y)
        loss.backward()
        losses.append(loss.item())
        opt.step()
        top = torch.topk(out.detach() * 2, 3).values
    z = top
    for _ in range(TAIL):
        z = z * 0.999 + 0.001
    return losses, z


def fusion_stats(rec: tb.Recording) -> FusionStats:
    return fuse(rec.trace.records, load_chip("v5p")).stats


def test_windows_and_cuts_equal_the_fusion_model(fused: object) -> None:
    ref_losses, ref_z = program("cpu")
    with tb.recording() as rec:
        losses, z = program("tpu")
    pjrt.flush()                                         # the trace's end: fusion flushes there too
    stats = pjrt.stats()
    model = fusion_stats(rec)
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    torch.testing.assert_close(z.cpu(), ref_z)
    assert (stats.windows, stats.cuts) == (model.windows, model.cuts)
    # collective, program: below; the tail's last cluster ends where the repeat detector ends it, not at the end.
    # Host->device copies, device copies and topk are deferred (TorchTPU): no cut of their own
    assert set(model.cuts) == {"backward", "repeated", "step"}
    assert model.cuts["step"] == model.cuts["backward"] == STEPS
    assert model.materialized.get("fanout", 0) > 0          # values with two consumers: outputs, not cuts
    assert stats.host_ops == 0, pjrt.host_ops()


def test_the_benchmark_mlp_has_the_fusion_windows_too(fused: object) -> None:
    ref = train(ElementwiseMLP(), mlp_batch(), STEPS, "cpu")
    torch.manual_seed(0)
    with tb.recording() as rec:
        got = train(ElementwiseMLP(), mlp_batch(), STEPS, "tpu")
    pjrt.flush()
    stats = pjrt.stats()
    model = fusion_stats(rec)
    assert got == pytest.approx(ref, rel=1e-5, abs=1e-6)
    assert sum(1 for r in rec.trace.records if getattr(r, "op", "") == "aten::abs") == 3 * STEPS   # empty out=s
    assert (stats.windows, stats.cuts) == (model.windows, model.cuts)
    assert set(OWN_CUTS) <= set(CUTS) and not set(stats.cuts) & set(OWN_CUTS)


def test_explicit_step_and_synchronize_cut_only_in_the_fusion_model(fused: object) -> None:
    x = torch.randn(8, device="tpu")                    # a random draw: the graph is split after it (random)
    with tb.recording() as rec:
        y = x.sin() + 1
        torch.tpu.synchronize()                         # fusion: a sync cut; here no hook, no flush needed
        y = y * 2
        tb.step()                                       # fusion: a step cut; likewise
        y = y.cos()
        y.cpu()
    stats, model = pjrt.stats(), fusion_stats(rec)
    assert model.cuts == {"sync": 2, "step": 1} and model.windows == 3
    assert stats.cuts == {"random": 1, "sync": 1} and stats.windows == 2


def test_views_of_pending_values_are_read_inside_the_window(fused: object) -> None:
    a = torch.randn(8, 6)
    t = a.to("tpu")
    h, g, f = t * 2, t * 3, t * 4                       # pending, contiguous; each read by one op (no fanout)
    got = h.t() @ h + g.sum(1, keepdim=True).expand(8, 6).sum(0) + f[:, 1:3].sum()   # transposed, expanded, sliced
    ref = (a * 2).t() @ (a * 2) + (a * 3).sum(1, keepdim=True).expand(8, 6).sum(0) + (a * 4)[:, 1:3].sum()
    torch.testing.assert_close(got.cpu(), ref)
    assert pjrt.stats().cuts == {"sync": 1} and pjrt.stats().windows == 1


def test_a_write_through_another_view_cuts_alias(fused: object) -> None:
    a = torch.arange(12.0).reshape(3, 4)
    t = a.to("tpu")
    t.mul_(2)
    t[1].add_(100)                                      # a write under another view of a pending value
    a.mul_(2)
    a[1].add_(100)
    torch.testing.assert_close(t.cpu(), a)
    assert pjrt.stats().cuts == {"alias": 1, "sync": 1}


COLLECTIVE = """
import os
os.environ.update(TPUSIM_RANKS="one", RANK="0", WORLD_SIZE="1")
import torch, torch.distributed as dist
import tpusim.backend as tb, tpusim.backend.distributed
from tpusim.backend.targets import pjrt
from tpusim.eager.fusion import fuse
from tpusim.hardware.spec import load_chip
pjrt.enable("fused")
dist.init_process_group()
x = torch.arange(4.0, device="tpu")
with tb.recording() as rec:
    a = x * 3 + 1
    dist.all_reduce(a)
    values = (a * 2).tolist()
print(values, pjrt.stats().cuts == fuse(rec.trace.records, load_chip("v5p")).stats.cuts, pjrt.stats().cuts)
"""


def test_a_collective_reads_the_pending_values_after_a_cut() -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", COLLECTIVE], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["[2.0,", "8.0,", "14.0,", "20.0]", "True", "{'collective':", "1,", "'sync':", "1}"]


def test_a_compiled_graph_reads_the_pending_values_after_a_cut(fused: object) -> None:
    x = torch.randn(8)
    f = torch.compile(lambda t: (t * 2).sin(), backend="tpu")
    y = x.to("tpu") * 5
    torch.testing.assert_close(f(y).cpu(), (x * 10).sin())
    assert pjrt.stats().cuts == {"program": 1}             # the graph ran on the window's values


LAYOUTS = [  # (base shape, strides, offset), (view shape, strides, offset): views of one 64-float storage
    (((4, 6), (6, 1), 0), ((6, 4), (1, 6), 0)),             # transposed
    (((4, 6), (6, 1), 0), ((4, 6, 3), (6, 1, 0), 0)),       # expanded
    (((4, 6), (6, 1), 0), ((4, 2), (6, 1), 1)),             # a column slice (a gather)
    (((4, 6), (6, 1), 0), ((4, 3), (6, 2), 0)),             # every other column (a gather)
    (((4, 6), (6, 1), 0), ((24,), (1,), 0)),                # flattened
    (((4, 6), (6, 1), 0), ((6,), (1,), 12)),                # one row
    (((6, 4), (1, 6), 0), ((4, 6), (6, 1), 0)),             # a transposed base read contiguously
    (((2, 5), (5, 1), 4), ((5,), (1,), 9)),                 # a base at an offset
    (((2, 3, 4), (4, 8, 1), 0), ((6, 4), (4, 1), 0)),       # a permuted 3-d base
]


@pytest.mark.parametrize(("base", "view"), LAYOUTS)
def test_views_derived_from_a_pending_value_equal_torch_views(base: tuple, view: tuple) -> None:
    import jax.numpy as jnp

    from tpusim.backend.targets.pjrt_fused import derive, view_spec

    storage = torch.arange(64.0)
    pending = storage.as_strided(*base)
    key = lambda shape, strides, offset: (0, offset, shape, strides, torch.float32)  # noqa: E731
    spec = view_spec(key(*base), key(*view))
    got = derive(jnp.asarray(pending.numpy()), spec)
    torch.testing.assert_close(torch.from_numpy(got.__array__().copy()), storage.as_strided(*view))


def test_views_the_window_cannot_derive() -> None:
    from tpusim.backend.targets.pjrt_fused import view_spec

    key = lambda shape, strides, offset, dtype=torch.float32: (0, offset, shape, strides, dtype)  # noqa: E731
    assert view_spec(key((4, 3), (6, 2), 0), key((3,), (2,), 0)) is None              # the pending value has gaps
    assert view_spec(key((2, 5), (5, 1), 4), key((5,), (1,), 12)) is None             # bytes outside it
    assert view_spec(key((4, 6), (6, 1), 0), key((24,), (1,), 0, torch.int32)) is None  # another dtype
