"""XLA's program as the kernels tpusim prices: one ``FusedKernel`` per fusion XLA built, per run.

``tpusim.eager.fusion`` puts these in place of its own grouping of a compiled program's ops when the TPU
compiler compiled that program (``fuse(..., compiled=...)``), so the engine prices XLA's kernels with
tpusim's calibrated compute and HBM model: the MXU for a fusion with a contraction (its largest one's
shape), the VPU otherwise; HBM bytes are what crosses the fusion's boundary.
"""

from __future__ import annotations

from tpusim.eager.fusion import FusedKernel
from tpusim.trace.ops import Family
from tpusim.xla.hlo import Fusion, XlaProgram

# XLA element types -> tpusim's (PyTorch's) dtype names. Adding a type = one row here.
DTYPES = {"bf16": "bfloat16", "f16": "float16", "f32": "float32", "f64": "float64", "s8": "int8",
          "u8": "uint8", "s16": "int16", "s32": "int32", "s64": "int64", "pred": "bool",
          "f8e4m3fn": "float8_e4m3fn", "f8e5m2": "float8_e5m2", "f8e4m3fnuz": "float8_e4m3fnuz",
          "f8e5m2fnuz": "float8_e5m2fnuz"}


def kernel_of(fusion: Fusion) -> FusedKernel:
    """One run of ``fusion`` as a kernel record (seq, rank, program and tensors are set where it runs)."""
    work = fusion.work
    dtype = DTYPES.get(work.dtype or fusion.dtype, "float32")
    return FusedKernel(seq=0, op=f"xla:{fusion.name}[{fusion.kind or 'fusion'}]", unit="mxu" if work.matmul else "vpu",
                       dtype=dtype, flops=work.flops, transcendentals=work.transcendentals,
                       bytes_read=float(fusion.read_bytes), bytes_written=float(fusion.written_bytes),
                       matmul=work.matmul, family=str(Family.CONTRACTION if work.matmul else Family.ELEMENTWISE))


def program_kernels(program: XlaProgram) -> tuple[FusedKernel, ...]:
    """Every kernel one execution of ``program`` launches, in schedule order (a loop's body once per trip)."""
    return tuple(kernel_of(f) for f in program.fusions for _ in range(f.times))
