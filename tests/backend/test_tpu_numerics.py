"""--numerics tpu (TPUSIM_NUMERICS=tpu): f32 matmuls, convolutions and attention on "tpu" as a TPU computes them.

The truths are computed here on CPU from the definitions (TorchTPU's precision notebook, StableHLO's dot_general
precision): DEFAULT rounds each f32 operand to bf16 and accumulates the exact products in f32; HIGH is bf16_3x,
hi.hi + (hi.lo + lo.hi) with hi = bf16(x), lo = bf16(x - hi); HIGHEST is f32. With numerics on (the default) the
device gives CPU's bits. allow_excess_precision keeps a compiled graph's bf16 values in f32: the notebook's
bit-13 test.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import tpusim.backend as tb
from tpusim.backend.dispatch import tpu_numerics
from tpusim.errors import TpusimError
from tpusim.hardware.spec import load_chip

P = torch.tpu.Precision


def hi(x: torch.Tensor) -> torch.Tensor:
    return x.bfloat16().float()


def bf16_3x(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    ah, bh = hi(a), hi(b)
    al, bl = hi(a - ah), hi(b - bh)
    return ah @ bh + (ah @ bl + al @ bh)


@pytest.fixture
def tpu() -> Iterator[None]:
    """tpu numerics on for one test (the device's switch; DeviceConfig.tpu_numerics sets it at configure)."""
    tpu_numerics.configure(True)
    try:
        yield
    finally:
        tpu_numerics.configure(False)


def pair(*shape: int) -> tuple[torch.Tensor, torch.Tensor]:
    a = torch.randn(*shape[:-1])
    b = torch.randn(*shape[-2:])
    return a, b


def test_default_rounds_f32_operands_to_bf16_and_accumulates_in_f32(tpu: None) -> None:
    a, b = pair(64, 256, 32)
    got = (a.to("tpu") @ b.to("tpu")).cpu()
    assert torch.equal(got, hi(a) @ hi(b))
    assert (got - a @ b).abs().max() > 1e-3                       # not CPU's f32


def test_high_is_bf16_3x_and_closer_to_f32_than_default(tpu: None) -> None:
    a, b = pair(64, 256, 32)
    exact = a.double() @ b.double()
    with torch.tpu.precision(P.HIGH):
        high = (a.to("tpu") @ b.to("tpu")).cpu()
    torch.testing.assert_close(high, bf16_3x(a, b), rtol=1e-6, atol=1e-6)
    default = (a.to("tpu") @ b.to("tpu")).cpu()
    assert (high.double() - exact).abs().max() * 100 < (default.double() - exact).abs().max()


def test_highest_is_cpu_bit_for_bit(tpu: None) -> None:
    a, b = pair(16, 64, 8)
    with torch.tpu.precision(P.HIGHEST):
        assert torch.equal((a.to("tpu") @ b.to("tpu")).cpu(), a @ b)


def test_numerics_on_is_cpu_bit_for_bit() -> None:
    assert not tpu_numerics.is_on()
    a, b = pair(16, 64, 8)
    bias = torch.randn(8)
    assert torch.equal((a.to("tpu") @ b.to("tpu")).cpu(), a @ b)
    assert torch.equal(F.linear(a.to("tpu"), b.t().to("tpu"), bias.to("tpu")).cpu(), F.linear(a, b.t(), bias))


def test_bf16_matmul_is_unchanged(tpu: None) -> None:
    a, b = (t.bfloat16() for t in pair(16, 64, 8))
    assert torch.equal((a.to("tpu") @ b.to("tpu")).cpu(), a @ b)


def test_linear_bias_and_batched_matmul_follow_default(tpu: None) -> None:
    x, w, bias = torch.randn(4, 5, 32), torch.randn(16, 32), torch.randn(16)
    assert torch.equal(F.linear(x.to("tpu"), w.to("tpu"), bias.to("tpu")).cpu(), F.linear(hi(x), hi(w), bias))
    a, b = torch.randn(3, 8, 32), torch.randn(3, 32, 4)
    assert torch.equal(torch.bmm(a.to("tpu"), b.to("tpu")).cpu(), torch.bmm(hi(a), hi(b)))


def test_conv2d_and_its_gradients_follow_default(tpu: None) -> None:
    x, w, bias = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3), torch.randn(4)
    dx, dw, db = (t.to("tpu").requires_grad_() for t in (x, w, bias))
    out = F.conv2d(dx, dw, db)
    assert torch.equal(out.detach().cpu(), F.conv2d(hi(x), hi(w), bias))
    out.square().sum().backward()
    g = 2 * out.detach().cpu()
    grads = torch.ops.aten.convolution_backward(hi(g), hi(x), hi(w), [4], [1, 1], [0, 0], [1, 1], False, [0, 0], 1,
                                                [True, True, False])
    assert torch.equal(dx.grad.cpu(), grads[0]) and torch.equal(dw.grad.cpu(), grads[1])
    torch.testing.assert_close(db.grad.cpu(), g.sum((0, 2, 3)))   # the bias gradient is a sum: f32, unrounded


def test_sdpa_follows_default_forward_and_backward(tpu: None) -> None:
    q, k, v = torch.randn(3, 2, 2, 16, 8).unbind(0)
    tq, tk, tv = (t.to("tpu").requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
    s = (hi(q) @ hi(k).transpose(-2, -1)) / 8 ** 0.5
    s = s.masked_fill(~torch.ones(16, 16, dtype=torch.bool).tril(), float("-inf"))
    p = torch.softmax(s, -1)
    assert torch.equal(out.detach().cpu(), hi(p) @ hi(v))         # the probabilities rounded at the second matmul
    out.backward(torch.ones_like(out))
    assert torch.equal(tv.grad.cpu(), hi(p.transpose(-2, -1)) @ hi(torch.ones(2, 2, 16, 8)))


def test_torch_tpu_ops_kernels_contract_at_default(tpu: None) -> None:
    lhs, rhs, sizes = torch.randn(10, 32), torch.randn(2, 32, 4), torch.tensor([4, 6])
    got = torch.tpu.ops.ragged_dot(lhs.to("tpu"), rhs.to("tpu"), sizes.to("tpu")).cpu()
    assert torch.equal(got, torch.cat([hi(lhs[:4]) @ hi(rhs[0]), hi(lhs[4:]) @ hi(rhs[1])]))


def test_a_compiled_function_follows_default(tpu: None) -> None:
    a, b = pair(16, 64, 8)
    compiled = torch.compile(lambda x, y: torch.relu(x @ y) * 2)
    assert torch.equal(compiled(a.to("tpu"), b.to("tpu")).cpu(), torch.relu(hi(a) @ hi(b)) * 2)


def test_allow_excess_precision_keeps_a_compiled_bf16_matmul_in_f32(tpu: None) -> None:
    """TorchTPU's notebook: (1 + 2**-6) x (1 + 2**-7) in bf16 has bit 13 only while excess precision is allowed."""
    eye = torch.eye(8, dtype=torch.bfloat16, device="tpu")
    a, b, one = eye * (1 + 2 ** -6), eye * (1 + 2 ** -7), torch.ones(1, device="tpu")
    rounded, exact = 1 + 2 ** -6 + 2 ** -7, 1 + 2 ** -6 + 2 ** -7 + 2 ** -13
    assert (a @ b * one)[0, 0].item() == rounded                    # eager: each op rounds to its dtype
    results = []
    for allow in (False, True):
        torch.backends.tpu.allow_excess_precision = allow
        try:
            results.append(torch.compile(lambda x, y, z: x @ y * z)(a, b, one)[0, 0].item())
        finally:
            torch.backends.tpu.allow_excess_precision = False
            torch.compiler.reset()
    assert results == [rounded, exact]


def test_tpu_numerics_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TPUSIM_DEVICE_CONFIG", raising=False)
    monkeypatch.setenv("TPUSIM_NUMERICS", "TPU")
    cfg = tb.load_config(chip=load_chip("v5e"))
    assert (cfg.numerics, cfg.tpu_numerics) == (True, True)
    assert not tb.load_config(chip=load_chip("v5e"), numerics=True).tpu_numerics   # a given numerics wins
    with pytest.raises(TpusimError, match="shape-only mode computes no values"):
        tb.DeviceConfig(chip=load_chip("v5e"), numerics=False, tpu_numerics=True)


SCRIPT = """\
import torch
a, b = torch.randn(32, 64), torch.randn(64, 16)
got = (a.to("tpu") @ b.to("tpu")).cpu()
print("tpu numerics:", torch.equal(got, a.bfloat16().float() @ b.bfloat16().float()), not torch.equal(got, a @ b))
"""


def test_the_flag_parses_into_run_options_and_back() -> None:
    from tpusim.cli.main import build_parser
    from tpusim.run.options import RunOptions

    args = build_parser().parse_args(["run", "m.py", "--numerics", "tpu"])
    options = RunOptions.from_args(args)
    assert options.numerics == "tpu" and options.argv()[options.argv().index("--numerics") + 1] == "tpu"
    with pytest.raises(TpusimError, match="accepted: on, off, tpu"):
        RunOptions(script="m.py", numerics=True)


@pytest.mark.slow
def test_tpusim_run_numerics_tpu(tmp_path: Path) -> None:
    script = tmp_path / "matmul.py"
    script.write_text(SCRIPT)
    out = tmp_path / "report"
    done = subprocess.run([sys.executable, "-m", "tpusim", "run", str(script), "--numerics", "tpu", "--compiler",
                           "model", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "tpu numerics: True True" in done.stdout
    assert "numerics tpu" in done.stderr + done.stdout
    assert json.loads((out / "report.json").read_text())["run"]["numerics"] == "tpu"


def test_run_help_teaches_the_three_values() -> None:
    from tpusim.cli.run import NUMERICS_HELP

    lines = NUMERICS_HELP.splitlines()
    assert [line.split(":")[0] for line in lines[1:]] == ["on", "off", "tpu"]
    assert all(len(line) <= 54 for line in lines)                   # one line each in an 80-column terminal
