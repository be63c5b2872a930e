"""A torch.compile'd int8 matmul: its quantize work (abs, amax, divide, round, clamp, cast) fuses into
the matmul's prologue, as XLA fuses it (tpusim/eager/fusion.py PROGRAM_PROLOGUES).

The truth: CPU's result for the numbers; for the bytes, the closed form of one kernel that reads x, the
int8 weights and the column scales once and writes only the float result.
"""

from __future__ import annotations

import pytest
import torch

import tpusim.backend as tb
from tpusim.eager.fusion import fuse
from tpusim.hardware.spec import load_chip
from tpusim.trace.records import OpRecord


def quantized_linear(x: torch.Tensor, w_int8: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    scale = x.abs().amax(dim=-1, keepdim=True) / 127.0
    xq = torch.clamp(torch.round(x / scale), -127, 127).to(torch.int8)
    return torch._int_mm(xq, w_int8).float() * scale * w_scale


@pytest.mark.slow          # torch.compile's first use in a process: ~15 s on the shared 2-core machine
def test_a_compiled_int8_matmul_takes_its_quantize_work_as_its_prologue() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 256, generator=g)
    w = torch.randint(-127, 128, (256, 128), dtype=torch.int8, generator=g)
    s = torch.rand(128, generator=g)
    compiled = torch.compile(quantized_linear)
    compiled(x.to("tpu"), w.to("tpu"), s.to("tpu"))                     # compile outside the recording
    with tb.recording() as rec:
        got = compiled(x.to("tpu"), w.to("tpu"), s.to("tpu"))
    torch.testing.assert_close(got.cpu(), quantized_linear(x, w, s))
    program = [r for r in rec.trace.records if isinstance(r, OpRecord) and r.program]
    names = {r.op.removeprefix("aten::").split(".")[0] for r in program}
    assert {"abs", "amax", "div", "round", "clamp", "_int_mm"} <= names
    fused = fuse(rec.trace.records, load_chip("v5p"))
    (kernel,) = [r for r in fused.records if isinstance(r, OpRecord) and r.program]
    assert len(kernel.parts) == len(program) and kernel.unit == "mxu"
    assert kernel.bytes_read == x.nbytes + w.nbytes + s.nbytes       # 64 KiB + 32 KiB + 512 B
    assert kernel.bytes_written == got.nbytes                         # the int8 x never reaches HBM


def weight_only_int8_linear(x: torch.Tensor, w_int8: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    return x @ (w_int8.to(x.dtype) * w_scale[:, None]).t()


def test_a_compiled_dequantize_fuses_into_the_matmul_that_reads_it() -> None:
    """Weight-only int8 (an int8 KV cache read by a matmul is the same shape of work): the widen-and-scale joins
    the matmul, as the TPU compiler fuses it (260 MiB a step for an 8192 x 8192 int8 weight under --compiler
    xla and now under the model too; 1 GiB before), so the bf16 copy of the weights never reaches HBM."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 256, generator=g, dtype=torch.bfloat16)
    w = torch.randint(-127, 128, (128, 256), dtype=torch.int8, generator=g)
    s = torch.rand(128, generator=g, dtype=torch.bfloat16)
    compiled = torch.compile(weight_only_int8_linear)
    compiled(x.to("tpu"), w.to("tpu"), s.to("tpu"))                     # compile outside the recording
    inputs = [t.to("tpu") for t in (x, w, s)]
    with tb.recording() as rec:
        got = compiled(*inputs)
    torch.testing.assert_close(got.cpu(), weight_only_int8_linear(x, w, s))
    fused = fuse(rec.trace.records, load_chip("v5e"))
    (kernel,) = [r for r in fused.records if isinstance(r, OpRecord) and r.program]
    assert kernel.unit == "mxu" and {p.op.split(".")[0] for p in kernel.parts} >= {"aten::_to_copy", "aten::mm"}
    assert kernel.bytes_read == x.nbytes + w.nbytes + s.nbytes       # the int8 weights, one byte an element
    assert kernel.bytes_written == got.nbytes
