"""The device's fast paths change no number: the C++ fallback, the cost cache and the one-step record
construction give exactly what the Python fallback, the cost rules and the record constructors give.

The truth here is the slow path run side by side: the same program through the Python fallback
(the shim's fast path off) must compute the same values and record the same trace (storage ids
aside: they count every storage the process ever made, so they are compared by first appearance).
"""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from torch import nn

import tpusim.backend as tb
from tpusim.backend.plumbing.state import STATE
from tpusim.backend.program_trace import costs, recorder
from tpusim.eager.windows import BACKWARD_REASON
from tpusim.trace import ops
from tpusim.trace.records import HostRecord, MemoryRecord, OpRecord, TensorMeta, Trace


@contextmanager
def _python_fallback() -> Iterator[None]:
    """Every op through tpusim/backend/dispatch/fallback.py, as on a target other than the simulator."""
    STATE.shim.set_fast(False)
    try:
        yield
    finally:
        STATE.target.activate()


def _canonical(trace: Trace) -> list:
    """The records with storage ids renumbered by first appearance (everything else as recorded)."""
    ids: dict[int, int] = {}

    def sid(s: int) -> int:
        return s if s < 0 else ids.setdefault(s, len(ids) + 1)

    def meta(m: TensorMeta) -> TensorMeta:
        return dataclasses.replace(m, storage=sid(m.storage))

    out = []
    for r in trace.records:
        if isinstance(r, MemoryRecord) or (isinstance(r, HostRecord) and r.storage):   # a copy's device storage
            r = dataclasses.replace(r, storage=sid(r.storage))
        elif isinstance(r, OpRecord):
            r = dataclasses.replace(r, inputs=tuple(map(meta, r.inputs)), outputs=tuple(map(meta, r.outputs)))
        out.append(r)
    return out


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.norm = nn.LayerNorm(16)
        self.attn = nn.MultiheadAttention(16, 2, dropout=0.1, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Dropout(0.1), nn.Linear(32, 16))
        self.rnn = nn.GRU(16, 8, batch_first=True)
        self.lstm = nn.LSTM(8, 8, batch_first=True)     # fused cells: the shim's C++ ones vs handwritten_kernels.py's
        self.head = nn.Linear(8, 50)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.norm(self.embed(tokens))
        x = x + self.attn(x, x, x, need_weights=False)[0]
        x = x + self.mlp(x) * 0.5
        return self.head(self.lstm(self.rnn(x)[0])[0])


def _program() -> tuple[list[torch.Tensor], Trace]:
    """A training step touching every kind of call the fallback maps: in-place and out= ops, views,
    list arguments and list results, wrapped scalars, random ops, foreach ops, copies, host reads."""
    torch.manual_seed(0)
    model = _Model().to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tokens = torch.randint(0, 50, (3, 7)).to("tpu")
    out = torch.empty(3, 7, 50, device="tpu")
    gc.collect()        # an earlier test's tensors freed by the collector mid-recording would be records too
    with tb.recording() as rec:
        for _ in range(2):
            logits = model(tokens)
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
            torch.add(logits.detach(), 1.5, out=out)
            parts = out.split([2, 5], dim=1)
            stacked = torch.cat([parts[0], parts[1]], dim=1).mul_(2).clamp_(-3, 3)
            picked = stacked[torch.tensor([0, 2], device="tpu")].sum(dim=-1, keepdim=True)
            copy = picked.clone().to(torch.bfloat16)
            loss.item()
            _ = copy.cpu()
    values = [loss.detach().cpu(), stacked.cpu(), picked.cpu(), copy.float().cpu(),
              *(p.detach().cpu() for p in model.parameters())]
    return values, rec.trace


def test_cpp_fallback_records_and_computes_what_the_python_fallback_does() -> None:
    fast_values, fast = _program()
    with _python_fallback():
        slow_values, slow = _program()
    for a, b in zip(fast_values, slow_values, strict=True):
        assert torch.equal(a, b)
    assert _canonical(fast) == _canonical(slow)
    assert [r.seq for r in fast.records] == list(range(len(fast.records)))
    made = [r for r in fast.records if isinstance(r, MemoryRecord)]        # built by the shim
    made += [m for r in fast.of_kind(OpRecord) for m in (*r.inputs, *r.outputs)]
    for r in made:
        built = type(r)(*dataclasses.astuple(r))
        assert r == built and r.__dict__ == built.__dict__ and repr(r) == repr(built)


def test_backward_ops_name_the_backward_line_and_prints_are_prints(capsys: pytest.CaptureFixture) -> None:
    w = torch.randn(4, 4, device="tpu", requires_grad=True)
    with tb.recording() as rec:
        loss = (w * 2).sum()
        loss.backward()  # the backward line
        print(w.grad)
    line = next(i for i, text in enumerate(open(__file__).read().splitlines(), 1) if "# the backward line" in text)
    sources = [o.source for o in rec.trace.of_kind(OpRecord)]
    assert f"test_fallback_speed_invariants.py:{line}" in sources      # ops of the autograd engine's thread
    hosts = rec.trace.of_kind(HostRecord)
    marks = [h for h in hosts if h.reason == BACKWARD_REASON]          # Fused eager's cut after backward()
    assert [h.source for h in marks] == [f"test_fallback_speed_invariants.py:{line}"]
    syncs = [h for h in hosts if h.reason != BACKWARD_REASON]
    assert syncs and all(h.reason == "print" for h in syncs)
    assert capsys.readouterr().out


@pytest.mark.parametrize("name", ["aten::add", "aten::sum", "aten::tanh", "aten::gelu_backward", "aten::_softmax",
                                  "aten::_foreach_mul_", "aten::_foreach_copy", "aten::cat", "aten::native_layer_norm",
                                  "aten::mm", "aten::embedding", "aten::sort"])
def test_cached_costs_equal_the_rules(name: str) -> None:
    shapes = [((4, 8), (8,)), ((3,), ()), ((0, 5), (2, 2))]
    for ins, out in shapes:
        tensors = [torch.empty(ins), torch.empty(out)]
        outs = [torch.empty(out)]
        counted = costs.counted_cost(name, tuple(t.numel() for t in tensors), tuple(t.numel() for t in outs))
        assert counted == ops.counted(name, tuple(t.numel() for t in tensors), tuple(t.numel() for t in outs))
        assert costs.counted_cost(name, tuple(t.numel() for t in tensors), (outs[0].numel(),)) is counted
        if not costs.reads_arguments(name):
            assert costs.op_cost(name, tensors, outs, ()) == counted


@pytest.mark.parametrize(("cls", "values"), [
    (OpRecord, (3, "aten::add", "vpu", "float32", (TensorMeta(1, (2,), "float32", 8, 4),), (), 2.0, 0.0, 8.0, 0.0,
                None, "x.py:1", 0, 2, "elementwise")),
    (MemoryRecord, (4, "free", 7, 64, 0)),
    (HostRecord, (5, "sync", "item", 4, 0.0, "x.py:2", 0)),
])
def test_records_made_in_one_step_equal_their_constructors(cls: type, values: tuple) -> None:
    make: Callable = recorder._maker(cls)
    made, built = make(*values), cls(*values)
    assert made == built and made.__dict__ == built.__dict__ and repr(made) == repr(built)
    assert dataclasses.asdict(made) == dataclasses.asdict(built)


def test_shape_only_results_made_from_a_seen_signature_equal_the_kernels(python: Callable) -> None:
    """Shape-only mode: results the shim makes from a signature it has seen (no meta kernel) are what the
    kernel made: the traces of the same steps without the cache, filling it, and reading it are equal."""
    result = python("""
        import torch, tpusim.backend as tb
        from torch import nn
        from tpusim.backend.plumbing.state import STATE
        import test_fallback_speed_invariants as t

        def run():
            torch.manual_seed(0)
            model = t._Model().to("tpu")
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
            tokens = torch.randint(0, 50, (3, 7), device="tpu")
            with tb.recording() as rec:
                for _ in range(2):
                    loss = nn.functional.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    x = torch.cat([loss.expand(4), (loss * 2.0).expand(1)]).view(5, 1).transpose(0, 1).contiguous()
            return t._canonical(rec.trace)

        STATE.shim.set_meta_cache(False)
        plain = run()
        STATE.shim.set_meta_cache(True)
        filling, reading = run(), run()
        assert plain == filling == reading, "differ"
        print(len(plain))
    """, env={"TPUSIM_NUMERICS": "off", "PYTHONPATH": str(Path(__file__).parent)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert int(result.stdout.split()[-1]) > 100
