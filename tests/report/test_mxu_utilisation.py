"""MXU utilisation in the report: each kernel against its own dtype's peak, so an int8 matmul at the int8
peak reads at most 100% (against bf16's peak it read 114-117% on int8 runs)."""

import pytest

from tpusim.eager.modes import get_mode
from tpusim.pricing import price
from tpusim.report import RunInfo, build_report
from tpusim.slice.topology import build_slice
from tpusim.trace.records import OpRecord, StepMarker, TensorMeta, Trace, renumber

STRICT = get_mode("strict")

N = 8192   # a multiple of every MXU size: no tile padding, so a matmul this big runs at the MXU peak


def matmul(dtype: str, out_dtype: str, size: int = 1) -> OpRecord:
    a = TensorMeta(1, (N, N), dtype, N * N * size, 1)
    b = TensorMeta(2, (N, N), dtype, N * N * size, 2)
    c = TensorMeta(3, (N, N), out_dtype, N * N * 4, 3)
    return OpRecord(0, "aten::_int_mm" if dtype == "int8" else "aten::mm", "mxu", dtype, (a, b), (c,),
                    flops=2.0 * N ** 3, bytes_read=a.nbytes + b.nbytes, bytes_written=c.nbytes,
                    matmul=(1, N, N, N))


def utilisation(*ops: OpRecord) -> float:
    slice_ = build_slice("3d:1x1x1", "v5p")
    trace = Trace(renumber([*ops, StepMarker(0, 0)]))
    report = build_report(RunInfo("mm.py"), trace, slice_, {"strict": price(trace, topology=slice_, mode=STRICT)})
    return report.modes["strict"].mxu_utilisation


def test_an_int8_matmul_at_the_int8_peak_reads_at_most_100_percent():
    chip = build_slice("3d:1x1x1", "v5p").chip
    assert chip.peak_int8_flops_per_s > 1.5 * chip.peak_bf16_flops_per_s     # why bf16's peak read > 100%
    # closed form: 2 N^3 FLOPs in 2 N^3 / int8 peak seconds plus one launch (and no more: MXU-bound)
    seconds = 2.0 * N ** 3 / chip.peak_int8_flops_per_s + chip.kernel_launch_ns / 1e9
    want = 2.0 * N ** 3 / (seconds * chip.peak_int8_flops_per_s)
    got = utilisation(matmul("int8", "int32"))
    assert got <= 1.0
    assert got == pytest.approx(want, rel=1e-6)


def test_mixed_dtypes_weigh_each_kernels_time_at_its_own_peak():
    chip = build_slice("3d:1x1x1", "v5p").chip
    launch = chip.kernel_launch_ns / 1e9
    flops = 2.0 * N ** 3
    seconds = {"int8": flops / chip.peak_int8_flops_per_s + launch,
               "bf16": flops / chip.peak_bf16_flops_per_s + launch}
    capacity = seconds["int8"] * chip.peak_int8_flops_per_s + seconds["bf16"] * chip.peak_bf16_flops_per_s
    got = utilisation(matmul("int8", "int32"), matmul("bfloat16", "bfloat16", size=2))
    assert got == pytest.approx(2 * flops / capacity, rel=1e-6)
    assert got <= 1.0
