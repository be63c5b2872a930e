"""The compilation cache every eager mode shares: a region compiles once per signature.

Why: on a TPU each region is an XLA executable. The first time a region (one op in Debug
and Strict, one cluster in Fused: the pending work one cut materializes, ``tpusim.eager.windows``,
keyed by all its kernels' ops, shapes and wiring; one torch.compile'd program in every mode)
is seen with given ops, shapes and dtypes it is compiled on the host (``chip.compile_s``);
later sights with the same signature are hits. Fused eager's repeated-subsequence cut makes
every layer of a model the same cluster, so a model compiles once per distinct layer
(``CompileCache.clusters_compiled``).
A single op is the same region in every mode (``FusedKernel`` of one part has no wiring, and a
cluster of one kernel is that kernel's region), so the key space is one.

A **recompile** is a miss at a region *position* seen in an earlier iteration with a
different signature: typically a shape that changes from step to step (a variable sequence
length, a last partial batch). A position is the region's source lines and op sequence plus
its occurrence within the iteration (one line such as ``model(x)`` runs many matmuls of
different shapes in one step: those are different regions, not recompiles). Iterations are
the trace's steps (``StepMarker``); a trace without step markers counts host syncs as
iteration ends. Each recompile names the source line of the first op whose tensors changed,
the classic PyTorch/XLA pain. Going back to shapes already compiled is a hit, not a recompile.

**How long a compile takes** (``compile_seconds``): a fixed part per executable (``chip.compile_s``)
plus a part per op compiled (``chip.compile_per_op_s`` x the region's ops), so a lone op costs little
and a whole compiled model seconds; both are estimates in the chip file (no public per-op figure).

``with_compiles`` prices misses on the host timeline as a ``dispatch`` host record with
reason ``compile`` before the kernel (the engine logs it as kind ``compile``).
Collectives are not regions here: the network model prices them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from tpusim.eager.cluster_cost import FusedKernel
from tpusim.hardware.spec import ChipSpec
from tpusim.trace.records import HostRecord, OpRecord, Record, StepMarker

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
    misses: int             # each cost compile_seconds(region) on the host
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
        self.clusters = 0               # Fused eager clusters looked up (each one region)
        self.clusters_compiled = 0      # of those, misses: distinct clusters compiled
        self.recompiles: list[Recompile] = []
        self.compile_s = 0.0            # host seconds the misses cost (with_compiles adds them)

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
                          compile_s=self.compile_s, recompiles=tuple(self.recompiles))


def compile_seconds(region: OpRecord, chip: ChipSpec) -> float:
    """Host time to compile ``region`` once: the chip's fixed part plus its per-op part x the ops in it
    (a fused cluster or compiled program counts every op it holds)."""
    return chip.compile_s + chip.compile_per_op_s * len(_parts(region))


def _recompile(old: OpRecord, new: OpRecord) -> Recompile:
    pairs = list(zip(_parts(old), _parts(new)))
    before, after = next(((a, b) for a, b in pairs if _part_key(a) != _part_key(b)), pairs[0])
    return Recompile(seq=new.seq, source=after.source, op=after.op,
                     old_shapes=tuple(t.shape for t in before.inputs),
                     new_shapes=tuple(t.shape for t in after.inputs))


def _regions(records: Sequence[Record]) -> dict[tuple, OpRecord]:
    """Each compiled program execution and each Fused eager cluster as one region: a record whose parts
    are all its kernels' ops (XLA compiles the whole graph once, keyed by its ops, shapes and wiring).
    A cluster of one kernel is that kernel's region, so a lone op is the same region in every mode."""
    kernels: dict[tuple, list[OpRecord]] = {}
    for rec in records:
        if isinstance(rec, OpRecord) and (rec.program or getattr(rec, "cluster", 0)):
            kernels.setdefault(_region_of(rec), []).append(rec)
    regions: dict[tuple, OpRecord] = {}
    for where, ks in kernels.items():
        if where[0] == "cluster" and len(ks) == 1:
            regions[where] = ks[0]
        elif where[0] == "cluster":
            regions[where] = FusedKernel.around(ks[0], tuple(p for k in ks for p in _parts(k)),
                                                op=f"cluster[{len(ks)} kernels]",
                                                wiring=tuple(getattr(k, "wiring", ()) for k in ks),
                                                exits=tuple(getattr(k, "exits", ()) for k in ks))
        else:
            regions[where] = FusedKernel.around(ks[0], tuple(p for k in ks for p in _parts(k)),
                                                op=f"program[{len(ks)} kernels]")
    return regions


def _region_of(rec: OpRecord) -> tuple | None:
    """The multi-kernel region a kernel belongs to: its compiled program or its eager cluster; None: its own."""
    if rec.program:
        return ("program", rec.program)
    cluster = getattr(rec, "cluster", 0)
    return ("cluster", cluster) if cluster else None


def with_compiles(records: Sequence[Record], chip: ChipSpec, cache: CompileCache) -> list[Record]:
    """``records`` with a compile host record before every op whose region misses ``cache``; a compiled
    program and a Fused eager cluster are one region each, looked up at their first kernel."""
    stepped = any(isinstance(rec, StepMarker) for rec in records)
    regions = _regions(records)
    out: list[Record] = []
    for rec in records:
        if isinstance(rec, StepMarker) or (not stepped and isinstance(rec, HostRecord) and rec.event == "sync"):
            cache.new_iteration()
        if isinstance(rec, OpRecord):
            # a program's or cluster's region is looked up at its first kernel; its later kernels find None
            where = _region_of(rec)
            region = rec if where is None else regions.pop(where, None)
            if getattr(rec, "follows", False):      # a later kernel of the executable just looked up
                region = None
            in_cluster = region is not None and where is not None and where[0] == "cluster"
            cache.clusters += in_cluster
            if region is not None and not cache.lookup(region):
                cache.clusters_compiled += in_cluster
                seconds = compile_seconds(region, chip)
                cache.compile_s += seconds
                out.append(HostRecord(seq=rec.seq, event="dispatch", reason="compile", seconds=seconds,
                                      source=rec.source, rank=rec.rank))
        out.append(rec)
    return out
