"""XLA's program as the records tpusim prices: one ``FusedKernel`` per fusion XLA built, per run, and one
collective per collective XLA scheduled.

``tpusim.eager.fusion`` puts these in place of its own grouping of a compiled program's ops when the TPU
compiler compiled that program (``fuse(..., compiled=...)``), so the engine prices XLA's kernels with
tpusim's calibrated compute and HBM model (the MXU for a fusion with a contraction, at its largest one's
shape, the VPU otherwise; HBM bytes are what crosses the fusion's boundary) and XLA's collectives over
tpusim's ICI simulator, in XLA's order: an async collective runs from its start while the kernels XLA
scheduled before its done run, and the first kernel after the done waits for it (a tensor of its own
links them).
"""

from __future__ import annotations

import dataclasses

from tpusim.eager.fusion import CompiledProgram, FusedKernel
from tpusim.trace.ops import Family
from tpusim.trace.records import CollectiveRecord, OpRecord, TensorMeta
from tpusim.xla.hlo import Fusion, XlaProgram

# XLA element types -> tpusim's (PyTorch's) dtype names. Adding a type = one row here.
DTYPES = {"bf16": "bfloat16", "f16": "float16", "f32": "float32", "f64": "float64", "s8": "int8",
          "u8": "uint8", "s16": "int16", "s32": "int32", "s64": "int64", "pred": "bool",
          "f8e4m3fn": "float8_e4m3fn", "f8e5m2": "float8_e5m2", "f8e4m3fnuz": "float8_e4m3fnuz",
          "f8e5m2fnuz": "float8_e5m2fnuz"}
# XLA's collectives -> tpusim's (tpusim.trace.records.COLLECTIVES). Adding one = one row here.
COLLECTIVE_NAMES = {"all-gather": "all_gather", "all-reduce": "all_reduce", "reduce-scatter": "reduce_scatter",
                    "all-to-all": "all_to_all", "ragged-all-to-all": "all_to_all", "collective-permute": "permute",
                    "collective-broadcast": "broadcast"}
RESULT_STORAGE = -(2**40)   # storages of async collectives' results (below the recorder's synthetic ones)


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


def program_records(program: XlaProgram, spans: int = 1) -> CompiledProgram:
    """One execution of ``program`` in XLA's schedule: its kernels and its collectives (see the module docstring)."""
    out: list[OpRecord | CollectiveRecord] = []
    started: dict[str, TensorMeta] = {}
    arrived: list[TensorMeta] = []
    for step in program.schedule:
        if step.what == "kernel" and step.fusion is not None:
            kernel = kernel_of(step.fusion)
            out.append(dataclasses.replace(kernel, inputs=tuple(arrived)) if arrived else kernel)
            arrived = []
        elif step.what in ("collective", "start") and step.opcode in COLLECTIVE_NAMES:
            storage = RESULT_STORAGE - len(out)
            result = TensorMeta(storage, (step.bytes,), "uint8", step.bytes, storage)
            out.append(CollectiveRecord(0, COLLECTIVE_NAMES[step.opcode], step.bytes, outputs=(result,),
                                        dtype=DTYPES.get(step.dtype, "float32"), async_op=step.what == "start"))
            if step.what == "start":
                started[step.key] = result
        elif step.what == "done" and step.key in started:
            arrived.append(started.pop(step.key))
    return CompiledProgram(tuple(out), spans)
