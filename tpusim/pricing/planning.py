"""An eager mode's plan of a trace: result checks, fusion and compiles, then host issue times.

``plan(trace, mode, chip)`` is the first half of pricing (``tpusim.pricing.price``); the
engine simulates the ModePlan it returns. Per simulated rank:

- **compiled programs** (torch.compile'd graphs, recorded with ``OpRecord.program``) are the
  same in every mode: one launch, fused as a whole by ``tpusim.eager.fusion``, one compile-cache
  region, and in debug one result check after the program.
- **fused**: the host records ops into windows (``tpusim.eager.fusion``), paying ``RECORD_SHARE``
  of a dispatch per op, and at each cut launches the window's fused kernels, paying the rest
  of a dispatch per kernel. The device waits while a window is recorded; it overlaps the
  recording of the next window.
- **debug**: the NaN/Inf test is folded into each op's kernel (2 VPU FLOPs per element of its
  floating outputs, a 1-byte flag written), the flag comes back over PCIe (a 1-byte ``d2h``)
  and the host reads it, priced like one op dispatch (a runtime call). An estimate: no public
  figure for a TPU flag read-back exists.

Every plan starts with a cold ``CompileCache`` (``tpusim.eager.compile_cache``), so modes compare
from the same start: a miss costs ``chip.compile_s`` on the host. ``ModePlan.meta`` gets
``compile_cache`` (``CacheStats``) and, when anything was fused, ``fusion`` (``FusionStats``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from tpusim.eager.cluster_cost import FusedKernel
from tpusim.eager.compile_cache import CompileCache, with_compiles
from tpusim.eager.compiled import MODEL_ONLY, CompilerOutput
from tpusim.eager.fusion import fuse
from tpusim.eager.modes import EagerMode
from tpusim.errors import TpusimError
from tpusim.hardware.spec import ChipSpec
from tpusim.pricing.plan import ModePlan, issue_seconds, rank_records, stream
from tpusim.trace.records import CollectiveRecord, HostRecord, OpRecord, Record, Trace

# Share of an eager op's host dispatch that Fused still pays per op: Python and the PyTorch
# dispatcher run for every op, but the runtime enqueue is paid once per fused kernel. Estimate:
# a no-op PyTorch op costs a few us in Python + dispatcher, about what a launch costs, so half.
RECORD_SHARE = 0.5
CHECK_FLOPS_PER_ELEMENT = 2.0   # debug: isfinite + AND-reduce per element of a floating output
DEBUG_CHECK = "debug_check"     # reason of debug's flag read-back host records


def plan(trace: Trace, mode: EagerMode, chip: ChipSpec, compiled: CompilerOutput = MODEL_ONLY) -> ModePlan:
    """The ModePlan of ``trace`` under ``mode`` on ``chip`` (see the module docstring); ``compiled``: what the
    TPU compiler built for program executions, eager ops and Fused eager clusters (``tpusim.xla.kernels``),
    priced in their place."""
    if not isinstance(mode, EagerMode):
        raise TpusimError(f"plan() takes an EagerMode (tpusim.eager.modes.get_mode({mode!r})), not {mode!r}")
    streams, meta = {}, None
    for rank, records in rank_records(trace).items():
        records, rank_meta = _rewrite(records, mode, chip, compiled)
        streams[rank] = stream(records, [dispatch_seconds(r, chip) for r in records])
        meta = rank_meta if meta is None else meta
    return ModePlan(mode.name, streams, trace.world_size, mode.queue_depth, mode.sync_each_op, meta or {})


def _rewrite(records: Sequence[Record], mode: EagerMode, chip: ChipSpec, compiled: CompilerOutput
             ) -> tuple[tuple[Record, ...], dict[str, Any]]:
    """One rank's records as the mode runs them: fused (and the compiler's kernels in place), checked, compiled."""
    meta: dict[str, Any] = {}
    if mode.fuse or compiled.ops or any(isinstance(r, OpRecord) and r.program for r in records):
        record_s = RECORD_SHARE * chip.host_dispatch_ns / 1e9 if mode.fuse else 0.0
        fused = fuse(records, chip, host_s_per_op=record_s, eager=mode.fuse, compiled=compiled)
        records, meta["fusion"] = fused.records, fused.stats
    if mode.check_results:
        records = with_checks(records, chip)
    cache = CompileCache()
    records = with_compiles(records, chip, cache)
    meta["compile_cache"] = cache.stats(chip)
    if "fusion" in meta:        # distinct Fused eager clusters: the compile cache's misses among them
        meta["fusion"] = dataclasses.replace(meta["fusion"], clusters_compiled=cache.clusters_compiled)
    return tuple(records), meta


def dispatch_seconds(record: Record, chip: ChipSpec) -> float:
    """Host time to issue one planned record: a compiled program's ops cost nothing of their own
    (its launch is one host record); a fused kernel costs the share of a dispatch not paid while
    its ops were recorded; everything else as recorded."""
    if isinstance(record, OpRecord | CollectiveRecord) and record.program:
        return 0.0
    if isinstance(record, FusedKernel) and record.follows:
        return 0.0                              # launched by the executable the kernel before it started
    if isinstance(record, FusedKernel) and not record.cluster:
        return issue_seconds(record, chip)      # an eager op's executable (XLA's kernels): the op's dispatch
    if isinstance(record, FusedKernel):
        return (1.0 - RECORD_SHARE) * chip.host_dispatch_ns / 1e9
    return issue_seconds(record, chip)


def with_checks(records: Sequence[Record], chip: ChipSpec) -> list[Record]:
    """Debug's result check after every op with floating outputs (see the module docstring); a compiled
    program is one launch, checked once, at its last kernel."""
    last_of_program = {r.program: i for i, r in enumerate(records) if isinstance(r, OpRecord) and r.program}
    out: list[Record] = []
    for i, rec in enumerate(records):
        checked = isinstance(rec, OpRecord) and (not rec.program or last_of_program[rec.program] == i)
        floats = [t for t in rec.outputs if _is_floating(t.dtype)] if checked else []
        if not floats:
            out.append(rec)
            continue
        elements = sum(math.prod(t.shape) for t in floats)
        out.append(dataclasses.replace(rec, flops=rec.flops + CHECK_FLOPS_PER_ELEMENT * elements,
                                       bytes_written=rec.bytes_written + 1))
        out.append(HostRecord(seq=rec.seq, event="d2h", reason=DEBUG_CHECK, bytes=1, source=rec.source,
                              rank=rec.rank))
        out.append(HostRecord(seq=rec.seq, event="dispatch", reason=DEBUG_CHECK,
                              seconds=chip.host_dispatch_ns / 1e9, source=rec.source, rank=rec.rank))
    return out


def _is_floating(dtype: str) -> bool:
    return any(kind in dtype for kind in ("float", "half", "complex"))
