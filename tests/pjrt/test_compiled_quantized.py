"""Quantized matmuls in torch.compile(backend="tpu") graphs: lowered to JAX (no graph runs op by op) and equal
to PyTorch's CPU kernels."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    from tpusim.backend.torch_compile.jax_backend import reset_stats

    reset_stats()


def _compiled_on_tpu(fn: object, *args: torch.Tensor) -> torch.Tensor:
    import tpusim.backend as tb

    out = torch.compile(fn, backend="tpu")(*(a.to("tpu") for a in args)).cpu()
    assert [g.lowered for g in tb.compile_stats().graphs] == [True]
    return out


def test_int_mm_is_exact_int32():
    a = torch.randint(-128, 128, (32, 64), dtype=torch.int8)
    b = torch.randint(-128, 128, (64, 48), dtype=torch.int8)
    got = _compiled_on_tpu(lambda x, y: torch._int_mm(x, y), a, b)
    assert got.dtype == torch.int32 and torch.equal(got, torch._int_mm(a, b))


def test_int8_quantize_matmul_dequantize_matches_cpu():
    def qlinear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        sx = x.abs().amax(1, keepdim=True) / 127
        sw = w.abs().amax(0, keepdim=True) / 127
        q = lambda t, s: (t / s).round().clamp(-127, 127).to(torch.int8)  # noqa: E731
        return torch._int_mm(q(x, sx), q(w, sw)).float() * sx * sw

    x, w = torch.randn(32, 64), torch.randn(64, 32)
    torch.testing.assert_close(_compiled_on_tpu(qlinear, x, w), qlinear(x, w), rtol=1e-5, atol=1e-5)


def test_weight_int8pack_mm_matches_cpu():
    x = torch.randn(16, 64)
    w = torch.randint(-128, 128, (32, 64), dtype=torch.int8)
    scales = torch.rand(32) + 0.5
    got = _compiled_on_tpu(lambda a, b, s: torch._weight_int8pack_mm(a, b, s), x, w, scales)
    torch.testing.assert_close(got, torch._weight_int8pack_mm(x, w, scales), rtol=1e-5, atol=1e-4)


def test_scaled_mm_matches_cpu():
    a = torch.randn(16, 32).to(torch.float8_e4m3fn)
    b = torch.randn(16, 32).to(torch.float8_e4m3fn).t()
    sa, sb = torch.tensor(0.5), torch.tensor(2.0)
    fn = lambda x, y, s, t: torch._scaled_mm(x, y, s, t, out_dtype=torch.float32)  # noqa: E731
    try:
        want = fn(a, b, sa, sb)
    except (RuntimeError, NotImplementedError) as err:
        pytest.skip(f"this PyTorch build has no CPU _scaled_mm: {err}")
    torch.testing.assert_close(_compiled_on_tpu(fn, a, b, sa, sb), want, rtol=1e-5, atol=1e-5)
