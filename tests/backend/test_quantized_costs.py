"""int8 / fp8 / weight-only matmuls on "tpu": CPU-equal values, recorded as quantized contractions at the MXU rate
of their input dtype (the chip's int8 or fp8 peak), not as elementwise work or at their int32 output's rate."""

import pytest
import torch

import tpusim.backend as tb
from tpusim.hardware.compute import kernel_cost
from tpusim.hardware.spec import load_chip
from tpusim.trace.ops import Family
from tpusim.trace.records import OpRecord

M, K, N = 512, 4096, 1024


def _record(fn, *args):
    with tb.recording() as rec:
        out = fn(*[a.to("tpu") for a in args])
    (op,) = [r for r in rec.trace.of_kind(OpRecord) if r.family == Family.QUANTIZED_CONTRACTION]
    return out.cpu(), op


def test_int_mm_matches_cpu_and_runs_at_the_int8_peak():
    a = torch.randint(-128, 127, (M, K), dtype=torch.int8)
    b = torch.randint(-128, 127, (K, N), dtype=torch.int8)
    out, op = _record(torch._int_mm, a, b)
    assert torch.equal(out, torch._int_mm(a, b))
    assert (op.dtype, op.unit, op.flops, op.matmul) == ("int8", "mxu", 2.0 * M * K * N, (1, M, K, N))
    chip = load_chip("v5p")
    cost = kernel_cost(op, chip)
    # v5p: 9.18e14 int8 FLOP/s over 8 MXUs; the shape fills whole 128x128 tiles and 8-row groups, so the MXU
    # term is the FLOPs at the int8 peak, 4.7 us; it beats the HBM term (2 + 4 + 2 MB at 2.76e12 B/s = 3.0 us)
    assert cost.bound == "mxu"
    assert cost.compute_s == pytest.approx(2.0 * M * K * N / chip.peak_int8_flops_per_s)


def test_scaled_mm_runs_at_the_fp8_rate_with_its_scaling_epilogue():
    a = torch.randn(M, K).to(torch.float8_e4m3fn)
    b = torch.randn(N, K).to(torch.float8_e4m3fn).t()
    one = torch.tensor(1.0)
    out, op = _record(lambda x, y, s, t: torch._scaled_mm(x, y, s, t, out_dtype=torch.bfloat16), a, b, one, one)
    assert torch.equal(out, torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16))
    assert op.dtype == "float8_e4m3fn" and op.flops == 2.0 * M * K * N + 2.0 * M * N
    chip = load_chip("v5p")
    assert kernel_cost(op, chip).compute_s == pytest.approx(2.0 * M * K * N / chip.peak_fp8_flops_per_s)


def test_weight_only_int8_runs_at_the_activations_rate():
    x = torch.randn(M, K, dtype=torch.bfloat16)
    w = torch.randint(-128, 127, (N, K), dtype=torch.int8)
    scales = torch.rand(N, dtype=torch.bfloat16)
    out, op = _record(torch.ops.aten._weight_int8pack_mm, x, w, scales)
    assert torch.equal(out, torch.ops.aten._weight_int8pack_mm(x, w, scales))
    assert op.dtype == "bfloat16" and op.matmul == (1, M, K, N)
    assert op.bytes_read == x.nbytes + w.nbytes + scales.nbytes      # the int8 weights are what shrink


# ---- attention: one fused op, CPU-exact, priced as flash attention ------------------------------------------
def _attention(causal: bool, s: int = 256, t: int = 256, heads: int = 4, d: int = 64):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, heads, n, d, requires_grad=True) for n in (s, t, t))
    qt, kt, vt = (x.detach().to("tpu").requires_grad_() for x in (q, k, v))
    with tb.recording() as rec:
        out = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        out.sum().backward()
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    ref.sum().backward()
    assert torch.equal(out.cpu(), ref)
    assert all(torch.equal(a.grad.cpu(), b.grad) for a, b in ((qt, q), (kt, k), (vt, v)))
    return [r for r in rec.trace.of_kind(OpRecord) if r.family == Family.ATTENTION]


@pytest.mark.parametrize("causal", [False, True])
def test_attention_is_one_fused_op_equal_to_cpu_with_flash_costs(causal):
    s = t = 256
    forward, backward = _attention(causal, s, t)
    bh, d = 2 * 4, 64
    # TorchTPU's eager flash kernel tiles a 256-token sequence as one 256 x 256 tile and skips only whole tiles
    # above the diagonal: under a causal mask the one tile is computed whole, as without one
    kept = bh * s * t
    assert forward.flops == pytest.approx(kept * (2.0 * (d + d) + 5.0)) and forward.transcendentals == kept
    assert backward.flops == pytest.approx(kept * (2.0 * (3 * d + 2 * d) + 5.0))    # scores recomputed
    # HBM: Q, K, V in; O and the log-sum-exp out (float32); never the s x t scores
    qkv = 3 * bh * s * d * 4
    assert forward.bytes_read == qkv and forward.bytes_written == bh * s * d * 4 + bh * s * 4
