"""The compilation cache every eager mode shares: a region compiles once per signature.

Why: on a TPU each kernel is an XLA executable. The first time a region (one op in Debug
and Strict, one fused kernel in Fused, one torch.compile'd program in every mode) is seen
with given ops, shapes and dtypes it is compiled on the host (``chip.compile_s``); later
sights with the same signature are hits.
A single op is the same region in every mode (``FusedKernel`` of one part has no wiring),
so the key space is one.

A **recompile** is a miss at a region *position* seen in an earlier iteration with a
different signature: typically a shape that changes from step to step (a variable sequence
length, a last partial batch). A position is the region's source lines and op sequence plus
its occurrence within the iteration (one line such as ``model(x)`` runs many matmuls of
different shapes in one step: those are different regions, not recompiles). Iterations are
the trace's steps (``StepMarker``); a trace without step markers counts host syncs as
iteration ends. Each recompile names the source line of the first op whose tensors changed,
the classic PyTorch/XLA pain. Going back to shapes already compiled is a hit, not a recompile.

``with_compiles`` prices misses on the host timeline as a ``dispatch`` host record with
reason ``compile`` before the kernel (the engine logs it as kind ``compile``).
Collectives are not regions here: the network model prices them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from tpusim.fusion import FusedKernel
from tpusim.spec import ChipSpec
from tpusim.trace import HostRecord, OpRecord, Record, StepMarker

Shapes = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Recompile:
    """A region compiled again at a known position because a shape or dtype changed."""

    seq: int                # the kernel's seq in the trace
    source: str             # the user's line of the first op whose tensors changed
    op: str
    old_shapes: Shapes      # that op's input shapes the last time this position ran
    new_shapes: Shapes


@dataclass(frozen=True)
class CacheStats:
    """One replay's compile-cache figures (``Timeline.meta["compile_cache"]``)."""

    regions: int            # kernel launches looked up (= hits + misses)
    hits: int
    misses: int             # each cost one compile_s on the host
    compile_s: float
    recompiles: tuple[Recompile, ...]


def _parts(op: OpRecord) -> tuple[OpRecord, ...]:
    return getattr(op, "parts", ()) or (op,)


def _part_key(op: OpRecord) -> tuple:
    return (op.op, op.unit, op.dtype, tuple((t.shape, t.dtype) for t in op.inputs),
            tuple((t.shape, t.dtype) for t in op.outputs))


def signature(op: OpRecord) -> tuple:
    """What a compiled executable is specialised on: ops, shapes, dtypes and how they connect."""
    return tuple(_part_key(p) for p in _parts(op)), getattr(op, "wiring", ()), getattr(op, "exits", ())


def position(op: OpRecord) -> tuple:
    """Where a region is in the program: its ops and their source lines."""
    return tuple((p.source, p.op) for p in _parts(op))


class CompileCache:
    """Signatures compiled so far, and the last signature seen at each position."""

    def __init__(self) -> None:
        self._compiled: set[tuple] = set()
        self._last: dict[tuple, tuple[tuple, OpRecord]] = {}
        self._occurrences: Counter[tuple] = Counter()
        self.hits = 0
        self.misses = 0
        self.recompiles: list[Recompile] = []

    def new_iteration(self) -> None:
        """A step ended: the next region at a position is its first occurrence again."""
        self._occurrences.clear()

    def lookup(self, op: OpRecord) -> bool:
        """Record one launch of ``op``'s region; True on a hit."""
        sig, here = signature(op), position(op)
        where = (here, self._occurrences[here])
        self._occurrences[here] += 1
        hit = sig in self._compiled
        if hit:
            self.hits += 1
        else:
            self.misses += 1
            self._compiled.add(sig)
            last = self._last.get(where)
            if last is not None and last[0] != sig:
                self.recompiles.append(_recompile(last[1], op))
        self._last[where] = (sig, op)
        return hit

    def stats(self, chip: ChipSpec) -> CacheStats:
        return CacheStats(regions=self.hits + self.misses, hits=self.hits, misses=self.misses,
                          compile_s=self.misses * chip.compile_s, recompiles=tuple(self.recompiles))


def _recompile(old: OpRecord, new: OpRecord) -> Recompile:
    pairs = list(zip(_parts(old), _parts(new)))
    before, after = next(((a, b) for a, b in pairs if _part_key(a) != _part_key(b)), pairs[0])
    return Recompile(seq=new.seq, source=after.source, op=after.op,
                     old_shapes=tuple(t.shape for t in before.inputs),
                     new_shapes=tuple(t.shape for t in after.inputs))


def _program_regions(records: Sequence[Record]) -> dict[int, OpRecord]:
    """Each compiled program execution as one region: a record whose parts are all its kernels' ops
    (XLA compiles the whole graph once, keyed by its ops and shapes)."""
    kernels: dict[int, list[OpRecord]] = {}
    for rec in records:
        if isinstance(rec, OpRecord) and rec.program:
            kernels.setdefault(rec.program, []).append(rec)
    return {program: FusedKernel.around(ks[0], tuple(p for k in ks for p in _parts(k)),
                                        op=f"program[{len(ks)} kernels]")
            for program, ks in kernels.items()}


def with_compiles(records: Sequence[Record], chip: ChipSpec, cache: CompileCache) -> list[Record]:
    """``records`` with a compile host record before every op whose region misses ``cache``; a compiled
    program is one region, looked up at its first kernel."""
    stepped = any(isinstance(rec, StepMarker) for rec in records)
    programs = _program_regions(records)
    out: list[Record] = []
    for rec in records:
        if isinstance(rec, StepMarker) or (not stepped and isinstance(rec, HostRecord) and rec.event == "sync"):
            cache.new_iteration()
        if isinstance(rec, OpRecord):
            # a program's region is looked up at its first kernel; its later kernels find None
            region = programs.pop(rec.program, None) if rec.program else rec
            if region is not None and not cache.lookup(region):
                out.append(HostRecord(seq=rec.seq, event="dispatch", reason="compile", seconds=chip.compile_s,
                                      source=rec.source, rank=rec.rank))
        out.append(rec)
    return out
