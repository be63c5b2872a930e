"""SDPA in torch.compile(backend="tpu") graphs: one fused op forward and backward
(tpusim/backend/aten/flash_attention.py), numerics equal to CPU's SDPA, and priced by the flash-attention rule
(no s x t tensor through HBM)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    from tpusim.backend.torch_compile.jax_backend import reset_stats

    reset_stats()


def _compiled_matches_cpu(compiled_fn, cpu_fn, inputs) -> tuple[str, str]:
    """Run ``compiled_fn`` compiled for "tpu" and ``cpu_fn`` on CPU, forward and backward; values and gradients
    must agree. Returns the compiled forward and backward graphs' code."""
    debug = []
    leaves = [t.clone().to("tpu").requires_grad_() for t in inputs]
    out = torch.compile(compiled_fn, backend="tpu", options={"debug_callback": debug.append})(*leaves)
    out.backward(torch.ones_like(out))
    cpu = [t.clone().requires_grad_() for t in inputs]
    want = cpu_fn(*cpu)
    want.backward(torch.ones_like(want))
    torch.testing.assert_close(out.detach().cpu(), want.detach(), rtol=1e-5, atol=1e-5)
    for got, ref in zip(leaves, cpu, strict=True):
        torch.testing.assert_close(got.grad.cpu(), ref.grad, rtol=1e-4, atol=1e-5)
    (forward,), (backward,) = debug[0].post_autograd_fx_forward_code, debug[0].post_autograd_fx_backward_code
    return forward, backward


@pytest.mark.parametrize("causal, masked", [(True, False), (False, True)])
def test_compiled_attention_is_one_fused_op_each_way_and_matches_cpu(causal, masked):
    q, k, v = (torch.randn(2, 3, 16, 8, dtype=torch.float32) for _ in range(3))
    mask = torch.rand(16, 16) > 0.3 if masked else None
    mask = mask | torch.eye(16, dtype=torch.bool) if masked else None   # every row keeps one key

    def attend(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        m = None if mask is None else mask.to(a.device)
        return F.scaled_dot_product_attention(a, b, c, attn_mask=m, is_causal=causal)

    forward, backward = _compiled_matches_cpu(attend, attend, (q, k, v))
    assert forward.count("tpusim.attention.default") == 1 and "softmax" not in forward
    assert backward.count("tpusim.attention_backward.default") == 1


def test_fused_attention_is_priced_as_flash_attention():
    from tpusim.backend.program_trace.compiled_program import program_of
    from tpusim.backend.torch_compile.jax_backend import JaxGraph

    def attend(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(a, b, c, is_causal=True)

    graphs = []
    q = torch.randn(1, 4, 256, 64, device="tpu")
    torch.compile(attend, backend="tpu", options={"debug_callback": graphs.append})(q, q, q)
    (graph,) = [g for g in graphs[0].compiled_executables if isinstance(g, JaxGraph)]
    (op,) = [o for o in program_of(graph.gm, "attention").ops if o.name == "tpusim::attention"]
    # causal flash forward: 2 matmuls over the kept half (plus the diagonal) of the 256 x 256 scores per head
    kept = 4 * 256 * 257 / 2
    assert op.cost.flops == pytest.approx(kept * (2 * 2 * (64 + 64) / 2 + 5), rel=1e-6)


def test_grouped_query_attention_inside_a_checkpoint_is_one_fused_op_and_matches_cpu():
    """enable_gqa (K and V with fewer heads) inside torch.utils.checkpoint: the rewrite reaches the checkpoint's
    body, and the values and gradients (K's and V's summed over each group of query heads) equal CPU's."""
    from torch.utils.checkpoint import checkpoint

    q = torch.randn(2, 4, 16, 8)
    k, v = torch.randn(2, 2, 16, 8), torch.randn(2, 2, 16, 8)

    def attend(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(a, b, c, is_causal=True, enable_gqa=True) * 2

    def block(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return checkpoint(attend, a, b, c, use_reentrant=False)

    forward, backward = _compiled_matches_cpu(block, attend, (q, k, v))
    assert "tpusim.attention.default" in forward and "softmax" not in forward + backward
    assert backward.count("tpusim.attention_backward.default") == 1
