"""The three eager modes, Debug, Strict and Fused, as engine queue policies.

The modes replay one recorded trace (record once, price many). On the sim target their
numerics are identical, so here a mode is a cost model of when work is issued and how it is
grouped:

- **strict**: asynchronous like CUDA. The host pays ``chip.host_dispatch_ns`` per op and
  enqueues it (queue of 1024); it waits only at syncs and when the queue is full.
- **debug**: synchronous. Each op completes before the next is issued, then its result is
  checked: the NaN/Inf test is folded into the op's kernel (2 VPU FLOPs per element of its
  floating outputs, a 1-byte flag written), the flag comes back over PCIe (a 1-byte ``d2h``)
  and the host reads it, priced like one op dispatch (a runtime call). An estimate: no public
  figure for a TPU flag read-back exists.
- **compiled programs** (torch.compile'd graphs, recorded with ``OpRecord.program``) are the
  same in every mode: one launch, fused as a whole by ``tpusim.fusion``, one compile-cache
  region, and in debug one result check after the program.
- **fused**: the host records ops into windows (``tpusim.fusion``), paying ``RECORD_SHARE``
  of a dispatch per op, and at each cut launches the window's fused kernels, paying the rest
  of a dispatch per kernel. The device waits while a window is recorded; it overlaps the
  recording of the next window.

Every replay starts with a cold ``CompileCache`` (``tpusim.compile_cache``), so modes compare
from the same start: a miss costs ``chip.compile_s`` on the host. ``Timeline.meta`` gets
``compile_cache`` (``CacheStats``) and, in fused, ``fusion`` (``FusionStats``).

Adding a mode = one ``EagerMode`` in ``MODES``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from tpusim.compile_cache import CompileCache, with_compiles
from tpusim.engine import Plan, QueuePolicy
from tpusim.errors import TpusimError
from tpusim.fusion import FusedKernel, fuse
from tpusim.spec import ChipSpec
from tpusim.trace import HostRecord, OpRecord, Record

# Share of an eager op's host dispatch that Fused still pays per op: Python and the PyTorch
# dispatcher run for every op, but the runtime enqueue is paid once per fused kernel. Estimate:
# a no-op PyTorch op costs a few us in Python + dispatcher, about what a launch costs, so half.
RECORD_SHARE = 0.5
CHECK_FLOPS_PER_ELEMENT = 2.0   # debug: isfinite + AND-reduce per element of a floating output
DEBUG_CHECK = "debug_check"     # reason of debug's flag read-back host records


@dataclasses.dataclass(frozen=True)
class EagerMode(QueuePolicy):
    """A queue policy plus the mode's rewrite of the stream: result checks or fusion, then compiles."""

    check_results: bool = False
    fuse: bool = False

    def plan(self, records: Sequence[Record], chip: ChipSpec) -> Plan:
        meta = {}
        stream: Sequence[Record] = records
        if self.fuse or any(isinstance(r, OpRecord) and r.program for r in records):
            record_s = RECORD_SHARE * chip.host_dispatch_ns / 1e9 if self.fuse else 0.0
            fused = fuse(records, chip, host_s_per_op=record_s, eager=self.fuse)
            stream, meta["fusion"] = fused.records, fused.stats
        if self.check_results:
            stream = with_checks(stream, chip)
        cache = CompileCache()
        stream = with_compiles(stream, chip, cache)
        meta["compile_cache"] = cache.stats(chip)
        return Plan(tuple(stream), meta)

    def dispatch_s(self, record: Record, chip: ChipSpec) -> float:
        if isinstance(record, OpRecord) and record.program:     # its program's launch is one host record
            return 0.0
        if isinstance(record, FusedKernel):     # its ops' recording was paid in the window's host record
            return (1.0 - RECORD_SHARE) * chip.host_dispatch_ns / 1e9
        return super().dispatch_s(record, chip)


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


STRICT = EagerMode("strict")
DEBUG = EagerMode("debug", queue_depth=1, sync_each_op=True, check_results=True)
FUSED = EagerMode("fused", fuse=True)
MODES: dict[str, EagerMode] = {"debug": DEBUG, "strict": STRICT, "fused": FUSED}
DEFAULT_MODE = "strict"


def get_mode(name: str) -> EagerMode:
    """The policy of one eager mode by name; an unknown name says which are accepted."""
    if name not in MODES:
        raise TpusimError(f"unknown eager mode {name!r}; accepted: {', '.join(MODES)}")
    return MODES[name]
