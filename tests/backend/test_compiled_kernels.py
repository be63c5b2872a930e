"""torch.tpu.ops' kernels inside torch.compile'd code: one op of the compiled graph (fullgraph, checkpointed
bodies too), with the eager kernel's values and gradients, as TorchTPU's recipes call splash attention inside
their compiled layers."""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

import tpusim.backend as tb
from tpusim.trace.records import OpRecord


def _layer(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.tpu.ops.splash_attention(q, k, v, is_causal=True) * 2


def _checkpointed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return checkpoint(_layer, q, k, v, use_reentrant=False)


def test_splash_attention_compiles_into_the_graph_with_the_eager_values_and_gradients() -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, heads, 128, 64, requires_grad=True) for heads in (4, 2, 2))
    _layer(q, k, v).sum().backward()                      # the eager kernel on CPU: the reference
    expected = [t.grad.clone() for t in (q, k, v)]
    reference = _layer(q, k, v).detach()
    tq, tk, tv = (t.detach().to("tpu").requires_grad_() for t in (q, k, v))
    compiled = torch.compile(_checkpointed, backend="tpu", fullgraph=True)      # a graph break would raise
    # f32 as the eager kernel computes it, whatever precision an earlier test of this process left behind
    with tb.recording() as rec, torch.tpu.precision(torch.tpu.Precision.HIGHEST):
        out = compiled(tq, tk, tv)
        out.sum().backward()
    torch.testing.assert_close(out.detach().cpu(), reference)
    for got, want in zip((tq.grad, tk.grad, tv.grad), expected):
        torch.testing.assert_close(got.cpu(), want)
    in_graphs = {op.op for op in rec.trace.of_kind(OpRecord) if op.program > 0}
    assert {"tpu::splash_attention", "tpu::splash_attention_backward"} <= in_graphs
