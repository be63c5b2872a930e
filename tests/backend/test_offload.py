"""Activation offload to the host (issue 43 item 2): save_on_cpu, a user's saved_tensors_hooks and non_blocking copies
record (shape-only mode too), compute CPU's values, and are priced on the chip's PCIe link with HBM freed.

The independent truths: CPU's own run (values, bit for bit), and torch's saved tensors on CPU (a counting pack hook:
what save_on_cpu copies each way)."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch
from torch import nn

import tpusim.backend as tb
from tpusim.hardware.spec import load_chip
from tpusim.pricing import price
from tpusim.report.model import mode_report
from tpusim.report.schema import ModeSection
from tpusim.report.summary import mode_rows
from tpusim.slice.topology import build_slice
from tpusim.trace.records import OFFLOAD_REASON, HostRecord, Trace
from tpusim.units import format_bytes


class Block(nn.Module):
    """A pre-norm transformer block written out (no SDPA: the same saved tensors on every device)."""

    def __init__(self, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attn = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, dim=-1)
        x = x + self.out((attn @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))


def saved_bytes_on_cpu(block: nn.Module, x: torch.Tensor) -> tuple[int, int]:
    """(count, bytes) of the tensors autograd saves for one forward of ``block`` on CPU: what an offload copies."""
    sizes: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        sizes.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(x).square().mean()
    return len(sizes), sum(sizes)


def offload_copies(trace: Trace) -> tuple[list[HostRecord], list[HostRecord]]:
    """The offloads (d2h, reason offload) and the copies back of the host buffers they filled."""
    hosts = trace.of_kind(HostRecord)
    out = [r for r in hosts if r.event == "d2h" and r.reason == OFFLOAD_REASON]
    filled = {r.host for r in out}
    return out, [r for r in hosts if r.event == "h2d" and r.host in filled]


def train_step(block: nn.Module, x: torch.Tensor, offload: contextlib.AbstractContextManager) -> torch.Tensor:
    """One forward (under ``offload``) and backward; the loss."""
    with offload:
        loss = block(x).square().mean()
    loss.backward()
    return loss


def pinned_hooks() -> torch.autograd.graph.saved_tensors_hooks:
    """torchtune-style offload: each saved tensor into a pinned host buffer, non_blocking both ways."""
    def pack(t: torch.Tensor) -> tuple[torch.device, torch.Tensor]:
        buffer = torch.empty(t.size(), dtype=t.dtype, pin_memory=True)
        buffer.copy_(t, non_blocking=True)
        return t.device, buffer

    def unpack(packed: tuple[torch.device, torch.Tensor]) -> torch.Tensor:
        device, buffer = packed
        return buffer.to(device, non_blocking=True)

    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)


OFFLOADS = {
    "save_on_cpu pinned": lambda: torch.autograd.graph.save_on_cpu(pin_memory=True, device_type="tpu"),
    "save_on_cpu": lambda: torch.autograd.graph.save_on_cpu(),
    "saved_tensors_hooks": pinned_hooks,
}


@pytest.mark.parametrize("how", list(OFFLOADS))
def test_offloaded_training_step_equals_cpu_and_copies_every_saved_tensor(how: str) -> None:
    torch.manual_seed(0)
    block, x = Block(), torch.randn(2, 8, 32)
    count, nbytes = saved_bytes_on_cpu(block, x)
    ref = train_step(block, x, contextlib.nullcontext())
    device_block = Block().to("tpu")
    device_block.load_state_dict(block.state_dict())
    with tb.recording() as rec:
        loss = train_step(device_block, x.to("tpu"), OFFLOADS[how]())
    assert torch.equal(loss.cpu(), ref.detach())
    for name, p in device_block.named_parameters():
        assert torch.equal(p.grad.cpu(), dict(block.named_parameters())[name].grad), name
    out, back = offload_copies(rec.trace)
    assert (len(out), sum(r.bytes for r in out)) == (count, nbytes)         # every saved tensor to the host ...
    assert (len(back), sum(r.bytes for r in back)) == (count, nbytes)       # ... and back, once, for backward
    assert all(r.non_blocking for r in (*out, *back)) == (how != "save_on_cpu")
    assert rec.trace.meta.host_peak_bytes == nbytes                         # all held at once, at the forward's end


def test_a_users_non_blocking_offload_round_trips_exact_values() -> None:
    torch.manual_seed(0)
    layer = nn.Linear(16, 16)
    x = torch.randn(4, 16)
    device_layer = nn.Linear(16, 16).to("tpu")
    device_layer.load_state_dict(layer.state_dict())
    with tb.recording() as rec:
        h = device_layer(x.to("tpu"))
        kept = h.to("cpu", non_blocking=True)            # the user's own offload
        del h
        back = device_layer(kept.to("tpu", non_blocking=True))
        torch.tpu.synchronize()
    assert torch.equal(back.cpu(), layer(layer(x)).detach())
    out, reload = offload_copies(rec.trace)
    assert [(r.bytes, r.non_blocking) for r in out] == [(4 * 16 * 4, True)]
    assert [(r.bytes, r.non_blocking) for r in reload] == [(4 * 16 * 4, True)]


def test_a_plain_cpu_copy_is_no_offload() -> None:
    """.cpu() to read a value stays a host sync: no offload, no host memory counted, no offload section."""
    with tb.recording() as rec:
        torch.ones(4, device="tpu").sum().cpu()
    assert offload_copies(rec.trace) == ([], [])
    assert rec.trace.meta.host_peak_bytes is None


def chain_peak(offload: bool, length: int = 8, n: int = 1 << 18) -> tuple[int, int]:
    """(HBM peak as priced, bytes offloaded) of a chain of sin (each saves its input) and its backward."""
    x = torch.randn(n, device="tpu", requires_grad=True)
    with tb.recording() as rec:
        with torch.autograd.graph.save_on_cpu() if offload else contextlib.nullcontext():
            y = x
            for _ in range(length):
                y = torch.sin(y)
        y.sum().backward()
    timeline = price(rec.trace, topology=build_slice("3d:1x1x1", chip=load_chip("v5p")))
    out, _ = offload_copies(rec.trace)
    return timeline.peak_hbm_bytes, sum(r.bytes for r in out)


def test_offloaded_activations_leave_hbm() -> None:
    size = (1 << 18) * 4
    kept, none = chain_peak(False)
    offloaded_peak, offloaded = chain_peak(True)
    assert offloaded == 8 * size                                     # the 8 saved inputs, x among them
    # Without offload HBM holds x, the 7 saved intermediates and the chain's end (+ the loss) when backward starts;
    # with it, the 7 intermediates are on the host: HBM is lower by the offloaded bytes less x (the caller holds it)
    # and the backward step's working set the offload adds back (a reloaded input beside its cos and gradients).
    assert none == 0 and kept - offloaded_peak == pytest.approx(offloaded - 3 * size, abs=64)


OFFLOAD_SCRIPT = """
    import torch, tpusim.backend as tb
    from torch import nn
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper, offload_wrapper
    from tpusim.trace.records import HostRecord

    def offloads(trace):
        return sum(r.bytes for r in trace.of_kind(HostRecord) if r.event == "d2h" and r.reason == "offload")

    torch.manual_seed(0)
    cpu = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))
    sizes = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: sizes.append(t.numel() * t.element_size()) or t,
                                                  lambda t: t):
        cpu(torch.randn(8, 32)).sum()
    print("cpu", sum(sizes))
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32)).to("tpu")
    x = torch.randn(8, 32, device="tpu")
    for name, ctx in [("pinned", lambda: torch.autograd.graph.save_on_cpu(pin_memory=True, device_type="tpu")),
                      ("blocking", lambda: torch.autograd.graph.save_on_cpu())]:
        with tb.recording() as rec:
            with ctx():
                loss = model(x).sum()
            loss.backward()
        print(name, offloads(rec.trace), rec.trace.meta.host_peak_bytes)
    wrapped = offload_wrapper(checkpoint_wrapper(model))     # torch.distributed's offload over checkpointing
    with tb.recording() as rec:
        wrapped(x).sum().backward()
    print("wrapper", offloads(rec.trace) > 0)
    with tb.recording() as rec:
        back = x.to("cpu", non_blocking=True).to("tpu", non_blocking=True)
    print("manual", offloads(rec.trace), tuple(back.shape))
    for what, read in [("read", lambda: x.cpu()), ("region", None)]:
        try:
            if read is None:
                with torch.autograd.graph.save_on_cpu():
                    x.cpu()                                  # a read inside the region, not in its pack hook
            else:
                read()
            print(what, "no error")
        except RuntimeError as err:
            print(what, "shape-only mode" in str(err), "non_blocking=True" in str(err))
"""


def test_shape_only_mode_records_offloads(python: object) -> None:
    proc = python(OFFLOAD_SCRIPT, env={"TPUSIM_NUMERICS": "off"})
    assert proc.returncode == 0, proc.stderr
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    nbytes = int(lines["cpu"])
    assert lines["pinned"] == f"{nbytes} {nbytes}" and lines["blocking"] == f"{nbytes} {nbytes}"
    assert lines["wrapper"] == "True" and lines["manual"] == f"{8 * 32 * 4} (8, 32)"
    assert lines["read"] == lines["region"] == "True True"    # value reads still raise, naming the way out


def as_json(section: dict) -> dict:
    """A mode's section as report.json holds it (tuples become lists)."""
    return json.loads(json.dumps(section))


def offload_report(how: str) -> tuple[ModeSection, float]:
    """The mode section (as report.json holds it) of one offloaded training step of a block, and its saved bytes."""
    torch.manual_seed(0)
    block, x = Block(dim=256, heads=4).to("tpu"), torch.randn(4, 128, 256, device="tpu")
    with tb.recording() as rec:
        train_step(block, x, OFFLOADS[how]())
        tb.step()
    slice_ = build_slice("3d:1x1x1", chip=load_chip("v5p"))
    section = as_json(mode_report(price(rec.trace, topology=slice_), rec.trace, slice_))
    return ModeSection.model_validate(section), saved_bytes_on_cpu(Block(dim=256, heads=4), x.cpu())[1]


def test_report_prices_the_offload_on_pcie() -> None:
    pcie = load_chip("v5p").pcie_bytes_per_s
    overlapped, nbytes = offload_report("save_on_cpu pinned")
    blocking, _ = offload_report("save_on_cpu")
    for mode in (overlapped, blocking):
        o = mode.offload
        assert (o.d2h_bytes, o.h2d_bytes) == (nbytes, nbytes) and o.host_peak_bytes == nbytes
        assert o.pcie_s == pytest.approx(2 * nbytes / pcie)     # each byte over the host link once each way
    # blocking copies stall the host for all of their time; non_blocking ones hide part of it under compute
    assert blocking.offload.pcie_exposed_s == pytest.approx(blocking.offload.pcie_s)
    assert overlapped.offload.pcie_exposed_s < overlapped.offload.pcie_s
    assert overlapped.total_s < blocking.total_s
    rows = dict(mode_rows({"strict": overlapped}, ["strict"]))
    assert rows["host peak (offload)"] == [format_bytes(nbytes)] and "PCIe (exposed)" in rows


def test_no_offload_no_section_and_no_rows() -> None:
    with tb.recording() as rec:
        torch.ones(8, device="tpu").sum().cpu()
    slice_ = build_slice("3d:1x1x1", chip=load_chip("v5p"))
    section = as_json(mode_report(price(rec.trace, topology=slice_), rec.trace, slice_))
    assert "offload" not in section
    mode = ModeSection.model_validate(section)
    assert not any(label.startswith(("host peak", "PCIe")) for label, _ in mode_rows({"strict": mode}, ["strict"]))
