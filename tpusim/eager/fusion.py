"""Fused eager: cut the op stream into windows and group each window into fused kernels.

Why: every eager op on a TPU is one kernel launch that reads its inputs from HBM and writes
its outputs back. A fused kernel pays one launch and keeps the values that never leave it in
on-chip memory, so a chain of small elementwise ops costs about what its first input and last
output cost to move. ``fuse(records, chip)`` is a pure trace transform; ``tpusim.eager.modes``
turns it into the Fused eager policy.

**Windows** (TorchTPU's clusters: what the host defers before anything runs) end where
``tpusim.eager.windows.WindowCutter`` says: at host syncs, collectives (unless TorchTPU's
``TORCH_TPU_INTERNAL_MATERIALIZE_COLLECTIVE_TENSORS=0`` keeps them in the graph, where a collective runs as
itself among the cluster's kernels), host reads, step markers, a change of eager mode, the end of
backward(), and by TorchTPU's heuristics (stale, forced split, dynamic shapes, random draws, repeated
layers; the cutter's docstring says what each does; a value with two consumers is an output of its
cluster, not a cut). Every op TorchTPU lowers stays in its cluster (gathers, copies, fills, sorts: fusion's
opaque role makes each a kernel of its own there); a host->device copy fills a fresh buffer and cuts
nothing. ``op_node`` is what the cutter sees of an op (the PJRT fused target feeds it the same for the ops
it runs, so both make the same clusters). When a cluster runs, its **dead** ops (nothing held or read what
they made: TorchTPU's queue holds them by weak references) are dropped unpriced, and the rest run as
TorchTPU's executables (``tpusim.eager.windows.splits_graph``): one per materialization point (a value
held at the cut, or read past the next such point) unless a repeat cut under ``aggressive`` compiles the
cluster whole. Each kernel carries its executable's number, its cluster's and the rule that ended it
(``FusedKernel.cluster``, ``.window``, ``.cut``): the compile cache keys an executable as one region. An
empty tensor read in a cluster is a constant re-emitted there, not an HBM read.

**Grouping.** Within a window, ops are taken in program order and grouped by data
dependence (which write of which storage id each input reads). An op joins the kernel(s)
that produced its inputs when the rules of its role allow (``RULES``):

- elementwise ops join their producers (chains, and prologues/epilogues of anchors);
- a reduction joins its producers (elementwise prologue); later elementwise ops join it
  (epilogue); at most one anchor (reduction or contraction) per kernel;
- a contraction (matmul, convolution: the MXU) never takes its producers into its kernel
  (no prologue), but elementwise consumers join it as epilogues.

If an op reads from several kernels, they merge when the merged kernel keeps one anchor,
keeps contractions without prologue, and creates no cycle (a kernel outside it that needs
it and that it needs); otherwise the op joins its most recent compatible producer, or
starts a kernel. Write-after-read and write-after-write on a storage are ordering edges
too. Kernels are emitted in a dependency order (earliest first op first).

**Bytes.** A fused kernel reads each value that enters it once and writes the values that
leave it. A value produced in the kernel is read from on chip by the kernel's own ops; it
stays on chip (its write is not counted) when all its readers are in the kernel and it dies
inside the window: its storage is freed, or wholly overwritten, before the window ends. A
value read later (saved for backward, read by a collective or another kernel) or still held
by the user when the window ends leaves the kernel: the user may read it (``.cpu()`` does not
name the tensors it copies, so "held at the cut" is the safe test).

**On-chip capacity.** XLA tiles a fused kernel: a value made and used inside it streams through
VMEM a tile at a time and never needs room for the whole tensor. The exception is a reduction
whose result is read inside the same kernel (``x / x.abs().amax()``, softmax, an int8 quantize):
the kernel runs in phases, each reduction ending one, and a value read in a later phase than the
one that made it (or an entering value read in two phases) must be held whole across the
barrier. Held values must fit ``chip.vmem_bytes`` (one TensorCore's VMEM) together; when they do
not, the largest go through HBM: a held intermediate's write and its reads, an entering value's
read once more per later phase (``spilled_bytes``). The kernel is not split, so its launch count
stays.

**Memory records** of a window stay as close to their ops as the kernel order allows: an
alloc goes just before the first kernel holding an op that followed it, a free just after
the last kernel holding an op that preceded it. The alloc/free pairs of storages whose every
value stayed on chip are dropped (they never touch HBM).

**Compiled programs** (ops recorded with ``program`` > 0: one execution of a torch.compile'd
graph, lowered to one XLA program) are fused in every mode, each execution as one window of
its own with no size limit: XLA sees the whole graph. Opaque ops in it run as kernels alone
(they do not cut it); an int8/fp8 matmul takes its quantize work (abs, amax, divide, round, clamp,
cast) as its prologue (``PROGRAM_PROLOGUES``), and a float matmul the dequantize of an int8/fp8 operand
(widen, times the scales), as XLA fuses both. Values that never leave the graph
were recorded with an alloc before their producer and a free after their last reader, so the on-chip rule above keeps an
intermediate out of HBM exactly when its producer and readers share a kernel; values crossing
kernels go through HBM, as between XLA fusions. The program is launched once: one
``dispatch`` host record (reason ``PROGRAM_REASON``) of one op's dispatch time, and its
kernels cost no host time of their own (``tpusim.eager.modes``).

Adding a fusion rule = one row in ``tpusim.trace.ops.OPS`` (what an op is) or ``RULES`` (what a
role may fuse with).
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import itertools
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tpusim.eager.windows import (
    BACKWARD_REASON,
    LAUNCH_REASON,
    Node,
    WindowCutter,
    defers,
    materialization_chunks,
    materialize_collectives,
    node_key,
    splits_graph,
)
from tpusim.hardware.compute import itemsize
from tpusim.hardware.spec import ChipSpec
from tpusim.trace.ops import base_name, fusion_role
from tpusim.trace.records import (
    MODE_CHANGE_REASON,
    CollectiveRecord,
    HostRecord,
    MemoryRecord,
    OpRecord,
    Record,
    StepMarker,
    TensorMeta,
    record_signature,
)

WINDOW_REASON = "fused_window"   # HostRecord reason of the host time spent recording a window
PROGRAM_REASON = "program_launch"  # HostRecord reason of a compiled program's one launch
MAX_NAME_PARTS = 6               # a kernel name lists at most this many op names
COLLECTIVE_PREFIX = "c10d::"     # a collective's name as a node of the fused graph
CONSTANT = -2                    # producer of a value read from a storage allocated and never written (an empty tensor)


@dataclass(frozen=True)
class Rule:
    """What an op of one role may do inside a fused kernel."""

    fusible: bool = True            # False: a kernel of its own in its cluster (no other op fuses with it)
    anchor: bool = False            # at most one anchor (reduction, contraction) per kernel
    takes_producers: bool = True    # may read values produced inside its own kernel (a prologue)
    anchors: int = 1                # anchors its kernel may hold (its own and its prologue's)


RULES: dict[str, Rule] = {
    "elementwise": Rule(),
    "reduction": Rule(anchor=True),
    "contraction": Rule(anchor=True, takes_producers=False),
    "opaque": Rule(fusible=False, takes_producers=False),
}

# Inside a compiled program (XLA sees the whole graph), ops of these families take their producers
# as a prologue, one reduction included: an int8/fp8 matmul's quantize (abs, amax, divide, round,
# clamp, cast) fuses into the matmul, as XLA fuses it. Eager clusters keep RULES. Adding one = one
# row here (keyed by tpusim.trace.ops family).
PROGRAM_PROLOGUES: dict[str, Rule] = {
    "quantized_contraction": Rule(anchor=True, takes_producers=True, anchors=2),
}
# Inside a compiled program a float matmul also takes a dequantize as its prologue (a kernel of elementwise ops
# that widens an int8/fp8 tensor, times its scales: ``_Grouper._dequantizes``), as the TPU compiler fuses it: a
# weight-only int8 matmul or an int8 KV cache read by a matmul moves one byte an element, not three.
WIDE_FLOATS = frozenset({"bfloat16", "float16", "float32"})


def _widens_one_byte(op: Record) -> bool:
    """A conversion of a one-byte tensor (int8, uint8, fp8) to a wider float: a dequantize's first step."""
    if not isinstance(op, OpRecord) or not op.inputs or not op.outputs:
        return False
    return itemsize(op.inputs[0].dtype) == 1 and op.outputs[0].dtype in WIDE_FLOATS


def role_of(op: OpRecord) -> str:
    """The fusion role of one op (a key of ``RULES``), from its recorded family and cost."""
    return fusion_role(op.family, op.unit, op.flops, op.transcendentals)


@dataclass(frozen=True)
class FusedKernel(OpRecord):
    """An op record standing for a region of one or more ops compiled and launched as one kernel.

    ``parts`` are the original records; ``wiring`` says where each part's inputs come from
    (("in", i): the kernel's i-th entering value; ("op", j, k): part j's k-th output) and
    ``exits`` which part outputs leave it; both are empty for a single op, so a lone op is the
    same compile-cache region in every mode.
    """

    parts: tuple[OpRecord, ...] = ()
    wiring: tuple[tuple[tuple, ...], ...] = ()
    exits: tuple[tuple[int, int], ...] = ()
    onchip_bytes: float = 0.0       # HBM bytes saved: on-chip intermediates' writes and reads
    reused_bytes: float = 0.0       # HBM bytes saved: a value entering once, read by several parts
    spilled_bytes: float = 0.0      # on-chip traffic that did not fit VMEM, counted as HBM
    cluster: int = 0                # the compiled executable of an eager cluster it belongs to, from 1; 0: none
    cut: str = ""                   # why that cluster ended (a tpusim.eager.windows.CUTS key)
    window: int = 0                 # the eager cluster (one materialization of the deferred graph), from 1;
    #                                 split graph runs it as several executables (``cluster``)
    follows: bool = False           # a later kernel of the executable the kernel before it started (an eager
    #                                 op XLA compiled to several): no dispatch or compile of its own

    @property
    def sources(self) -> tuple[str, ...]:
        return tuple(p.source for p in self.parts)

    @classmethod
    def around(cls, record: OpRecord, parts: tuple[OpRecord, ...], **changes: object) -> FusedKernel:
        """A kernel record with ``record``'s fields (``changes`` replacing some) standing for ``parts``."""
        fields = {f.name: getattr(record, f.name) for f in dataclasses.fields(OpRecord)}
        return cls(**{**fields, **changes}, parts=parts)


@dataclass(frozen=True)
class CompiledProgram:
    """What the TPU compiler built for a compiled program (``tpusim.xla.kernels``): its kernels and collectives
    in XLA's schedule, standing for ``spans`` consecutive program executions from its own number (a graph
    with collectives, compiled whole: its segments and the collectives recorded between them)."""

    records: tuple[OpRecord | CollectiveRecord, ...]
    spans: int = 1


@dataclass(frozen=True)
class ClusterCall:
    """A Fused eager cluster as one program of its ops, for the TPU compiler (``tpusim.xla.clusters``): each op's
    signature (``record_signature``), where each op's inputs come from (("in", i): the cluster's i-th entering
    value; ("op", j, k): op j's k-th output) and which op outputs leave the cluster. Equal calls are one
    executable: compiled once, priced alike."""

    signatures: tuple[str, ...]
    wiring: tuple[tuple[tuple[str | int, ...], ...], ...]
    exits: tuple[tuple[int, int], ...]
    entering: int


def cluster_call(parts: Sequence[OpRecord], leaving: Sequence[TensorMeta]) -> ClusterCall:
    """The ``ClusterCall`` of a cluster's ops (program order) whose values ``leaving`` it reach HBM."""
    produced: dict[int, tuple[int, int]] = {}
    entering: dict[int, int] = {}
    wiring = []
    for j, part in enumerate(parts):
        wiring.append(tuple(("op", *produced[t.id]) if t.id in produced
                            else ("in", entering.setdefault(t.id, len(entering))) for t in part.inputs))
        produced.update({t.id: (j, k) for k, t in enumerate(part.outputs)})
    exits = tuple(dict.fromkeys(produced[t.id] for t in leaving if t.id in produced))
    return ClusterCall(tuple(record_signature(p) for p in parts), tuple(wiring), exits, len(entering))


@dataclass(frozen=True)
class FusionStats:
    """What fusion did to one record stream (for the report)."""

    ops: int = 0                    # ops that ran in clusters (windows); dropped ones not counted
    kernels: int = 0                # kernels those clusters became
    windows: int = 0                # eager clusters: materializations of the deferred graph (the cutter's count)
    executables: int = 0            # compiled executables those clusters ran as (kSplitGraph: one per
    #                                 materialization point; kFullGraph: one per cluster)
    dropped: int = 0                # deferred ops dropped unrun: nothing held or read what they made
    cuts: dict[str, int] = field(default_factory=dict)   # why clusters ended: sync, backward, repeated, ...
    materialized: dict[str, int] = field(default_factory=dict)   # values made cluster outputs: fanout, ...
    clusters_compiled: int = 0      # distinct executables (compile-cache misses among them; set by planning)
    onchip_bytes: float = 0.0
    reused_bytes: float = 0.0
    spilled_bytes: float = 0.0
    programs: int = 0               # compiled-program executions (each one window; not in ops/kernels/windows)
    program_ops: int = 0
    program_kernels: int = 0


@dataclass(frozen=True)
class Fused:
    records: tuple[Record, ...]
    stats: FusionStats


# ---- dataflow: which write of which storage each input reads ------------------------------------
@dataclass
class _Value:
    producer: int                   # record position that wrote it; -1 = written before the trace;
    #                                 CONSTANT: an empty tensor's (TorchTPU re-emits it where it is read)
    nbytes: int
    readers: list[int] = field(default_factory=list)
    death: int | None = None        # position of its free or full overwrite; None = outlives the trace


class _Dataflow:
    def __init__(self, records: Sequence[Record]) -> None:
        self.values: list[_Value] = []
        self.reads: dict[tuple[int, int], int] = {}     # (position, input index) -> value
        self.writes: dict[tuple[int, int], int] = {}    # (position, output index) -> value
        current: dict[int, int] = {}                    # storage -> its latest value
        fresh: set[int] = set()                         # storages allocated in the trace and not written since
        for pos, rec in enumerate(records):
            if isinstance(rec, OpRecord | CollectiveRecord):
                for k, t in enumerate(rec.inputs):
                    v = current.get(t.storage)
                    if v is None:
                        v = current[t.storage] = self._new(CONSTANT if t.storage in fresh else -1, t.nbytes)
                    self.values[v].readers.append(pos)
                    self.reads[(pos, k)] = v
                for k, t in enumerate(rec.outputs):
                    old = current.get(t.storage)
                    if old is not None and self.values[old].death is None and t.nbytes >= self.values[old].nbytes:
                        self.values[old].death = pos            # wholly overwritten; partial writes keep it
                    self.writes[(pos, k)] = current[t.storage] = self._new(pos, t.nbytes)
                    fresh.discard(t.storage)
            elif isinstance(rec, MemoryRecord):
                (fresh.add if rec.event == "alloc" else fresh.discard)(rec.storage)
                old = current.pop(rec.storage, None)
                if old is not None and rec.event == "free" and self.values[old].death is None:
                    self.values[old].death = pos

    def _new(self, producer: int, nbytes: int) -> int:
        self.values.append(_Value(producer, nbytes))
        return len(self.values) - 1

    def producers(self, pos: int, rec: OpRecord) -> set[int]:
        return {self.values[self.reads[(pos, k)]].producer for k in range(len(rec.inputs))}

    def leaves(self, v: int, kernel: set[int], end: int) -> bool:
        """True when the value must reach HBM: read outside ``kernel`` or alive at the window's end."""
        value = self.values[v]
        return value.death is None or value.death >= end or any(r not in kernel for r in value.readers)


# ---- grouping -----------------------------------------------------------------------------------
@dataclass
class _Group:
    members: list[int]
    anchors: int
    sealed: set[int]                # positions that must stay outside (producers of its contractions)
    needs: set[int]                 # positions that must run before it
    closed: bool = False            # an opaque op or a collective: a kernel of its own
    limit: int = 1                  # anchors it may hold (Rule.anchors)


class _Grouper:
    """Greedy program-order grouping of one window's ops (positions) into kernels."""

    def __init__(self, records: Sequence[Record], flow: _Dataflow, program: bool = False) -> None:
        self.records, self.flow = records, flow
        self.program = program                      # a compiled program's window: PROGRAM_PROLOGUES apply
        self.groups: dict[int, _Group] = {}
        self.group_of: dict[int, int] = {}
        self.touched: dict[int, list[int]] = {}     # storage -> window positions that read or wrote it

    def add(self, pos: int) -> None:
        rec = self.records[pos]
        role = "opaque" if isinstance(rec, CollectiveRecord) else role_of(rec)     # a collective in the graph
        rule = RULES[role]
        if self.program and role != "opaque":
            rule = PROGRAM_PROLOGUES.get(rec.family, rule)
        producers = {p for p in self.flow.producers(pos, rec) if p in self.group_of}
        hazards = {p for t in rec.outputs for p in self.touched.get(t.storage, ())}
        prologue = self._dequantizes(producers) if self.program and role == "contraction" else set()
        sealed = set() if rule.takes_producers else {p for p in producers if self.group_of[p] not in prologue}
        group = _Group([pos], int(rule.anchor), sealed, producers | hazards, closed=not rule.fusible,
                       limit=rule.anchors)
        sources = sorted({self.group_of[p] for p in producers} if rule.takes_producers else prologue, reverse=True)
        if sources:
            options = [sources] + ([[g] for g in sources] if len(sources) > 1 else [])
            for option in options:
                if self._can_merge(option, group):
                    group = self._merge(option, group)
                    break
        if rule.anchors > 1:                        # the prologue is taken: later ops add no anchor to it
            group.limit = max(1, group.anchors)
        gid = min(group.members)
        self.groups[gid] = group
        for p in group.members:
            self.group_of[p] = gid
        for t in (*rec.inputs, *rec.outputs):
            self.touched.setdefault(t.storage, []).append(pos)

    def _dequantizes(self, producers: set[int]) -> set[int]:
        """The kernels among ``producers``' that only widen a one-byte tensor (int8/fp8 to a float, times its
        scales: a dequantize, no anchor): inside a compiled program XLA fuses them into the matmul that reads
        them, so the matmul reads the one-byte tensor and the widened copy never reaches HBM (``WIDE_FLOATS``)."""
        gids = {self.group_of[p] for p in producers}
        return {g for g in gids if not self.groups[g].anchors and not self.groups[g].closed
                and any(_widens_one_byte(self.records[p]) for p in self.groups[g].members)}

    def _can_merge(self, gids: list[int], new: _Group) -> bool:
        groups = [self.groups[g] for g in gids]
        members = {p for g in groups for p in g.members} | set(new.members)
        limit = max(g.limit for g in (*groups, new))
        if new.anchors + sum(g.anchors for g in groups) > limit or any(g.closed for g in groups):
            return False
        if any(g.sealed & members for g in groups):
            return False
        # A cycle: some kernel outside the merge that the merge needs, and that needs the merge.
        outside = {self.group_of[p] for g in (*groups, new) for p in g.needs} - set(gids)
        seen, stack = set(), list(outside)
        while stack:
            gid = stack.pop()
            if gid in seen:
                continue
            seen.add(gid)
            needs = self.groups[gid].needs
            if needs & members:
                return False
            stack.extend({self.group_of[p] for p in needs} - seen - set(gids))
        return True

    def _merge(self, gids: list[int], new: _Group) -> _Group:
        groups = [self.groups.pop(g) for g in gids]
        members = sorted({p for g in (*groups, new) for p in g.members})
        needs = {p for g in (*groups, new) for p in g.needs} - set(members)
        sealed = {p for g in (*groups, new) for p in g.sealed}
        return _Group(members, sum(g.anchors for g in (*groups, new)), sealed, needs,
                      limit=max(g.limit for g in (*groups, new)))

    def kernels(self) -> list[list[int]]:
        """Groups in a dependency order, earliest first member first."""
        deps = {gid: {self.group_of[p] for p in g.needs} - {gid} for gid, g in self.groups.items()}
        users: dict[int, set[int]] = {gid: set() for gid in self.groups}
        for gid, ds in deps.items():
            for d in ds:
                users[d].add(gid)
        ready = [gid for gid, ds in deps.items() if not ds]
        heapq.heapify(ready)
        order = []
        while ready:
            gid = heapq.heappop(ready)
            order.append(self.groups[gid].members)
            for user in users[gid]:
                deps[user].discard(gid)
                if not deps[user]:
                    heapq.heappush(ready, user)
        return order


# ---- one fused kernel ---------------------------------------------------------------------------
def _kernel(records: Sequence[Record], flow: _Dataflow, members: list[int], end: int,
            chip: ChipSpec) -> tuple[FusedKernel, set[int]]:
    """The record of one kernel and the values it keeps on chip."""
    parts: tuple[OpRecord, ...] = tuple(records[p] for p in members)
    if len(parts) == 1:
        constant = _constant_bytes(flow, members[0], parts[0])
        if constant:
            return FusedKernel.around(parts[0], parts, bytes_read=max(0.0, parts[0].bytes_read - constant),
                                      onchip_bytes=constant), set()
        return FusedKernel.around(parts[0], parts), set()
    inside = set(members)
    index = {p: i for i, p in enumerate(members)}
    produced = {flow.writes[(p, k)]: (index[p], k) for p in members for k in range(len(records[p].outputs))}
    leaving = {v for v in produced if flow.leaves(v, inside, end)}
    phase = _phases(parts, [[flow.reads[(p, k)] for k in range(len(records[p].inputs))] for p in members], produced)
    reader_phases: dict[int, set[int]] = {}
    for p in members:
        for k in range(len(records[p].inputs)):
            reader_phases.setdefault(flow.reads[(p, k)], set()).add(phase[index[p]])
    made_in = {v: phase[i] for v, (i, _) in produced.items()}
    held = {v for v, phases in reader_phases.items()
            if (max(phases) > made_in[v] if v in produced else len(phases) > 1)}
    spilled = _spill(held, flow, chip.vmem_bytes)
    inputs: list[TensorMeta] = []
    entered: dict[int, int] = {}
    entered_in: dict[int, set[int]] = {}            # entering value -> phases that read it from HBM
    wiring: list[tuple[tuple, ...]] = []
    internal = reused = spill_bytes = 0.0
    for p, part in zip(members, parts):
        wires = []
        for k, t in enumerate(part.inputs):
            v = flow.reads[(p, k)]
            if v in produced:
                wires.append(("op", *produced[v]))
                if v in spilled and phase[index[p]] > made_in[v]:
                    spill_bytes += t.nbytes
                else:
                    internal += t.nbytes
            else:
                if v not in entered:
                    entered[v] = len(inputs)
                    inputs.append(t)
                    entered_in[v] = {phase[index[p]]}
                    if flow.values[v].producer == CONSTANT:     # an empty tensor: re-emitted, not read
                        internal += t.nbytes
                elif v in spilled and phase[index[p]] not in entered_in[v]:
                    entered_in[v].add(phase[index[p]])
                    spill_bytes += t.nbytes
                else:
                    reused += t.nbytes
                wires.append(("in", entered[v]))
        wiring.append(tuple(wires))
    outputs: list[TensorMeta] = []
    exits: list[tuple[int, int]] = []
    kept_writes = 0.0
    for p, part in zip(members, parts):
        for k, t in enumerate(part.outputs):
            v = flow.writes[(p, k)]
            if v in leaving:
                outputs.append(t)
                exits.append((index[p], k))
            elif v in spilled:
                spill_bytes += t.nbytes
            else:
                kept_writes += t.nbytes
    kept = set(produced) - leaving - spilled
    anchor = next((q for q in parts if role_of(q) == "contraction"), None)
    reduction = next((q for q in parts if role_of(q) == "reduction"), None)
    first = parts[0]
    record = FusedKernel(
        seq=first.seq, op=_kernel_name(parts), unit="mxu" if anchor else "vpu",
        dtype=(anchor or first).dtype, inputs=tuple(inputs), outputs=tuple(outputs),
        flops=sum(q.flops for q in parts), transcendentals=sum(q.transcendentals for q in parts),
        bytes_read=max(0.0, sum(q.bytes_read for q in parts) - internal - reused),
        bytes_written=max(0.0, sum(q.bytes_written for q in parts) - kept_writes),
        matmul=anchor.matmul if anchor else None, source=first.source, rank=first.rank,
        program=first.program, family=(anchor or reduction or first).family, parts=parts, wiring=tuple(wiring),
        exits=tuple(exits),
        onchip_bytes=internal + kept_writes, reused_bytes=reused, spilled_bytes=spill_bytes)
    return record, kept


def _constant_bytes(flow: _Dataflow, pos: int, op: OpRecord) -> int:
    """Bytes of the empty tensors ``op`` reads: TorchTPU re-emits such a constant inside each executable that
    reads it (events_queue.cc: constants are never outputs), so they are not read from HBM."""
    constants = {flow.reads[(pos, k)]: t.nbytes for k, t in enumerate(op.inputs)
                 if flow.values[flow.reads[(pos, k)]].producer == CONSTANT}
    return sum(constants.values())


def _phases(parts: Sequence[OpRecord], reads: list[list[int]], produced: dict[int, tuple[int, int]]) -> list[int]:
    """Each part's phase: how many in-kernel reductions must finish before it can run."""
    phase: list[int] = []
    for part_reads in reads:
        phase.append(max((phase[produced[v][0]] + (role_of(parts[produced[v][0]]) == "reduction")
                          for v in part_reads if v in produced), default=0))
    return phase


def _spill(held: set[int], flow: _Dataflow, capacity: int) -> set[int]:
    """Held values (see the module docstring) to send through HBM, largest first, until the rest fit."""
    spilled: set[int] = set()
    live = sorted(held, key=lambda v: (-flow.values[v].nbytes, v))
    total = sum(flow.values[v].nbytes for v in live)
    for victim in live:
        if total <= capacity:
            break
        total -= flow.values[victim].nbytes
        spilled.add(victim)
    return spilled


def _kernel_name(parts: Sequence[OpRecord]) -> str:
    names = [base_name(p.op) for p in parts]
    if len(names) > MAX_NAME_PARTS:
        return f"fused[{'+'.join(names[:MAX_NAME_PARTS - 1])}+...+{names[-1]}]({len(names)} ops)"
    return f"fused[{'+'.join(names)}]"


def _compiled_kernels(records: Sequence[Record], flow: _Dataflow, window: list[int], end: int, chip: ChipSpec,
                      number: int, built: Sequence[OpRecord | CollectiveRecord],
                      recorded: Sequence[CollectiveRecord] = ()) -> tuple[list[Record], dict[int, int]]:
    """What the TPU compiler built for program execution ``number``, placed where its ops ran: the first kernel
    reads what enters the program, the last writes what leaves it (so what waits for them still waits), its
    collectives run over the group the recorded ones used, and the program's ops spread over its records in
    order (where its memory records go)."""
    whole, _ = _kernel(records, flow, window, end, chip)
    first = records[window[0]]
    kernels = [i for i, k in enumerate(built) if isinstance(k, OpRecord)]
    group = recorded[0] if recorded else None
    awaited = {t.storage for k in built if isinstance(k, OpRecord) for t in k.inputs}
    # an async collective no kernel waits for ends the program: what leaves the program waits for it (the
    # device runs in order, so later readers also come after the last kernel)
    unawaited = [k for k in built if isinstance(k, CollectiveRecord) and k.async_op and group is not None
                 and not any(t.storage in awaited for t in k.outputs)]
    out: list[Record] = []
    for i, k in enumerate(built):
        if isinstance(k, OpRecord):
            leaving = whole.outputs if i == kernels[-1] and not unawaited else ()
            k = dataclasses.replace(k, seq=first.seq, rank=first.rank, program=number, source=first.source,
                                    inputs=(*(whole.inputs if i == kernels[0] else ()), *k.inputs),
                                    outputs=(*k.outputs, *leaving))
        elif group is not None:
            leaving = whole.outputs if unawaited and k is unawaited[-1] else ()
            k = dataclasses.replace(k, seq=first.seq, rank=first.rank, source=first.source, group=group.group,
                                    mesh_axis=group.mesh_axis, program=number, outputs=(*k.outputs, *leaving))
        else:
            continue                                # no recorded group to run it over: the kernels still run
        out.append(k)
    emitted = {pos: i * len(out) // len(window) for i, pos in enumerate(window)}
    return out, emitted


_NONE = CompiledProgram(())


def _op_kernels(op: OpRecord, built: CompiledProgram) -> list[FusedKernel]:
    """An eager op run as the kernels XLA compiled its one-op program to: the first reads its inputs, is
    dispatched and compiled as the op (its only part), the last writes its outputs."""
    kernels = [k for k in built.records if isinstance(k, FusedKernel)]
    last = len(kernels) - 1
    return [dataclasses.replace(k, seq=op.seq, rank=op.rank, source=op.source, program=0,
                                inputs=op.inputs if i == 0 else (), outputs=op.outputs if i == last else (),
                                parts=(op,) if i == 0 else (), follows=i > 0)
            for i, k in enumerate(kernels)]


def _spans(records: Sequence[Record], compiled: Mapping[int, CompiledProgram]) -> dict[int, int]:
    """Each graph compiled whole (``CompiledProgram.spans`` > 1): position of its first op -> of its last."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for pos, rec in enumerate(records):
        if isinstance(rec, OpRecord | CollectiveRecord) and rec.program:
            first.setdefault(rec.program, pos)
            last[rec.program] = pos
    return {first[n]: max(last[n + i] for i in range(c.spans) if n + i in last) for n, c in compiled.items()
            if c.spans > 1 and c.records and n in first}


# ---- windows ------------------------------------------------------------------------------------
def _cut_reason(rec: Record) -> str:
    """The window cut (a ``tpusim.eager.windows.CUTS`` key) of a record that is not a fusible eager op."""
    if isinstance(rec, HostRecord):
        if rec.reason == BACKWARD_REASON:
            return "backward"
        if rec.reason == LAUNCH_REASON:
            return "launch"
        return "mode" if rec.reason.startswith(MODE_CHANGE_REASON) else rec.event
    if isinstance(rec, CollectiveRecord):
        return "collective"
    if isinstance(rec, StepMarker):
        return "step"
    return "opaque"


def op_node(rec: OpRecord) -> Node:
    """An eager op as the window cutter's deferred graph sees it: its hash, the storages it reads and
    writes, whether TorchTPU defers it (``tpusim.eager.windows.defers``: by the op, not by its cost family)."""
    return Node(key=node_key(rec.op, tuple((t.shape, t.dtype) for t in rec.inputs)),
                reads=tuple(t.storage for t in rec.inputs), writes=tuple(t.storage for t in rec.outputs),
                fusible=defers(rec.op), name=rec.op, source=rec.source,
                results=tuple(t.shape for t in rec.outputs))


def collective_node(rec: CollectiveRecord) -> Node:
    """A collective as a node of the fused graph (``TORCH_TPU_INTERNAL_MATERIALIZE_COLLECTIVE_TENSORS=0``): a
    deferred op like any other, hashed by its kind and input shapes."""
    name = f"{COLLECTIVE_PREFIX}{rec.collective}"
    return Node(key=node_key(name, tuple((t.shape, t.dtype) for t in rec.inputs)),
                reads=tuple(t.storage for t in rec.inputs), writes=tuple(t.storage for t in rec.outputs),
                name=name, source=rec.source, results=tuple(t.shape for t in rec.outputs))


def _grouped(records: Sequence[Record], flow: _Dataflow, members: list[int], end: int, chip: ChipSpec,
             cluster: int, cut: str, program: bool = False, window: int = 0
             ) -> tuple[list[Record], set[int], dict[int, int]]:
    """This module's grouping of ``members`` into kernels (numbered ``cluster``, ended by ``cut``; 0: a compiled
    program's): the kernels, the values kept on chip, each member's kernel index. A collective kept in a
    fused graph is a group of its own and runs as itself."""
    grouper = _Grouper(records, flow, program=program)
    for pos in members:
        grouper.add(pos)
    kernels: list[Record] = []
    kept: set[int] = set()
    emitted: dict[int, int] = {}
    for group in grouper.kernels():
        if isinstance(records[group[0]], CollectiveRecord):
            kernel: Record = records[group[0]]
        else:
            kernel, on_chip = _kernel(records, flow, group, end, chip)
            if cluster:
                kernel = dataclasses.replace(kernel, cluster=cluster, cut=cut, window=window)
            kept |= on_chip
        emitted.update(dict.fromkeys(group, len(kernels)))
        kernels.append(kernel)
    return kernels, kept, emitted


def _dead(records: Sequence[Record], flow: _Dataflow, window: list[int], end: int) -> set[int]:
    """The window's ops TorchTPU drops (events_queue.cc: the queue holds a deferred op by a weak reference):
    no value they make is held at the cut or read by an op that runs. Collectives (side effects) and ops
    that make nothing always run."""
    members = set(window)
    dead: set[int] = set()
    for pos in reversed(window):
        rec = records[pos]
        if isinstance(rec, CollectiveRecord) or not rec.outputs:
            continue
        values = [flow.values[flow.writes[(pos, k)]] for k in range(len(rec.outputs))]
        if not any(v.death is None or v.death >= end or any(r not in dead and (r in members or r >= end)
                                                              for r in v.readers) for v in values):
            dead.add(pos)
    return dead


def _executables(records: Sequence[Record], flow: _Dataflow, members: list[int], end: int,
                 cut: str) -> list[list[int]]:
    """The cluster's ops (positions) as the executables TorchTPU runs them in: one when the cut compiles the
    whole graph, else one per materialization point (``tpusim.eager.windows.materialization_chunks``): a value
    held at the cut (or read after it) is an output; a collective always is one (its side effects). A
    ``_foreach_`` op's per-tensor records (consecutive records of one op from one line) are one node, as the
    one multi-output op they are on TorchTPU."""
    if not members:
        return []
    if not splits_graph(cut):
        return [members]
    nodes: list[list[int]] = []
    for pos in members:
        if nodes and _one_dispatch(records[nodes[-1][-1]], records[pos]):
            nodes[-1].append(pos)
        else:
            nodes.append([pos])
    node_of = {pos: i for i, node in enumerate(nodes) for pos in node}
    outputs, last_read = [], []
    for node in nodes:
        required, last = False, -1
        for pos in node:
            rec = records[pos]
            values = [flow.values[flow.writes[(pos, k)]] for k in range(len(rec.outputs))]
            required = required or isinstance(rec, CollectiveRecord) or not values or \
                any(v.death is None or v.death >= end for v in values)
            last = max([last, *(node_of.get(r, len(nodes) if r >= end else -1) for v in values for r in v.readers)])
        outputs.append(required)
        last_read.append(last)
    return [[pos for i in chunk for pos in nodes[i]] for chunk in materialization_chunks(outputs, last_read)]


def _one_dispatch(before: Record, rec: Record) -> bool:
    """Two consecutive records of one ``_foreach_`` dispatch: the same op from the same line."""
    return isinstance(before, OpRecord) and isinstance(rec, OpRecord) and bool(rec.source) and \
        before.source == rec.source and base_name(before.op) == base_name(rec.op)


def fuse(records: Sequence[Record], chip: ChipSpec, *, host_s_per_op: float = 0.0, eager: bool = True,
         compiled: Mapping[int, CompiledProgram] | None = None,
         compiled_ops: Mapping[str, CompiledProgram] | None = None,
         compiled_clusters: Mapping[ClusterCall, CompiledProgram] | None = None,
         clusters_out: list[tuple[int, int, ClusterCall]] | None = None,
         cuts_out: list[tuple[int, str]] | None = None) -> Fused:
    """Group ``records`` into fused kernels (see the module docstring).

    ``host_s_per_op`` > 0 adds, at each window's flush, one ``dispatch`` host record of
    that many seconds per op in the window (reason ``WINDOW_REASON``): the host recording
    the window while the device waits for it. ``eager=False`` fuses only compiled programs
    (Debug and Strict: their eager ops stay one kernel each). ``compiled`` maps a compiled program's
    execution number to what the TPU compiler built for it (``tpusim.xla.kernels``): it runs in place of
    this module's grouping of its ops (and, for a graph compiled whole, of its segments and collectives).
    ``compiled_ops`` maps an eager op's signature (``record_signature``) to its one-op program: where ops
    stay one executable each (``eager=False``), its kernels run in the op's place (``_op_kernels``).
    ``compiled_clusters`` does the same for Fused eager clusters (by ``ClusterCall``); ``clusters_out``, when
    given, collects each executable's (number, first op's seq, call) for the compiler to compile; ``cuts_out``,
    each eager cluster's (last op's seq, the cut that ended it).
    """
    compiled = compiled or {}
    compiled_ops = compiled_ops or {}
    compiled_clusters = compiled_clusters or {}
    records = list(records)
    flow = _Dataflow(records)
    out: list[Record] = []
    window: list[int] = []
    held: list[tuple[int, MemoryRecord]] = []       # (position, record) of the window's memory records
    program = 0                                     # the compiled program the window holds; 0: eager ops
    cutter = WindowCutter()
    in_graph = not materialize_collectives()        # collectives are nodes of the fused graph
    totals = Counter()

    def cluster_kernels(chunk: list[int], end: int, reason: str, number: int) -> tuple[list[Record], set[int],
                                                                                     dict[int, int]]:
        """The kernels of one executable of an eager cluster (``number``): what the TPU compiler built for it,
        else this module's grouping; a collective kept in the graph runs as itself, in its place."""
        call = None
        if (compiled_clusters or clusters_out is not None) and \
                not any(isinstance(records[p], CollectiveRecord) for p in chunk):
            call = cluster_call([records[p] for p in chunk], _kernel(records, flow, chunk, end, chip)[0].outputs)
            if clusters_out is not None:
                clusters_out.append((number, records[chunk[0]].seq, call))
        if call is not None and compiled_clusters.get(call, _NONE).records:
            kernels, emitted = _compiled_kernels(records, flow, chunk, end, chip, 0, compiled_clusters[call].records)
            parts = tuple(records[p] for p in chunk)        # compiled as the cluster's ops: its region and cost
            return [dataclasses.replace(k, cluster=number, cut=reason, window=cutter.windows,
                                        parts=parts if i == 0 else ())
                    for i, k in enumerate(kernels)], set(), emitted
        return _grouped(records, flow, chunk, end, chip, number, reason, window=cutter.windows)

    def flush(end: int, reason: str) -> None:
        if not window:
            out.extend(m for _, m in held)
            held.clear()
            return
        dead: set[int] = set()
        if program in compiled and compiled[program].records:
            kernels, emitted = _compiled_kernels(records, flow, window, end, chip, program, compiled[program].records,
                                                 span_collectives)
            kept: set[int] = set()
        elif program:
            kernels, kept, emitted = _grouped(records, flow, window, end, chip, 0, "", program=True)
        else:
            if cuts_out is not None:
                cuts_out.append((records[window[-1]].seq, reason))
            dead = _dead(records, flow, window, end)
            chunks = _executables(records, flow, [p for p in window if p not in dead], end, reason)
            dead |= set(window) - {p for chunk in chunks for p in chunk}
            kernels, kept, emitted = [], set(), {}
            for chunk in chunks:
                totals["executables"] += 1
                made, on_chip, placed = cluster_kernels(chunk, end, reason, totals["executables"])
                emitted.update({p: len(kernels) + i for p, i in placed.items()})
                kernels += made
                kept |= on_chip
        memory = [m for _, m in held]
        dropped = _on_chip_storages(records, flow, window, kept, memory, dead)
        first = records[window[0]]
        ran = [k for k in kernels if isinstance(k, OpRecord)]
        if program:
            out.append(HostRecord(seq=first.seq, event="dispatch", reason=PROGRAM_REASON,
                                  seconds=chip.host_dispatch_ns / 1e9, source=first.source, rank=first.rank))
            totals.update(programs=1, program_ops=len(window), program_kernels=len(kernels))
        else:
            if host_s_per_op > 0:                   # the host recorded every op, the dropped ones too
                out.append(HostRecord(seq=first.seq, event="dispatch", reason=WINDOW_REASON,
                                      seconds=len(window) * host_s_per_op, source=first.source, rank=first.rank))
            totals.update(ops=len(window) - len(dead), kernels=len(ran), dropped=len(dead))
        out.extend(_interleave(kernels, [(q, m) for q, m in held if m.storage not in dropped], emitted))
        fused = [k for k in kernels if isinstance(k, FusedKernel)]
        totals.update(onchip=sum(k.onchip_bytes for k in fused), reused=sum(k.reused_bytes for k in fused),
                      spilled=sum(k.spilled_bytes for k in fused))
        window.clear()
        held.clear()
        span_collectives.clear()

    spans = _spans(records, compiled)                # graphs compiled whole: first op -> last op of their segments
    span_end = -1
    span_collectives: list[CollectiveRecord] = []
    for pos, rec in enumerate(records):
        if pos in spans:                            # XLA's one program stands for the segments and collectives
            flush(pos, cutter.boundary("program"))
            program, span_end = rec.program, spans[pos]
        if pos <= span_end:
            if isinstance(rec, OpRecord):
                window.append(pos)
            elif isinstance(rec, CollectiveRecord):
                span_collectives.append(rec)
            elif isinstance(rec, MemoryRecord):
                held.append((pos, rec))
            else:
                out.append(rec)
            if pos == span_end:
                flush(pos + 1, cutter.boundary("program"))
                program = 0
            continue
        if isinstance(rec, MemoryRecord):
            held.append((pos, rec))
            continue
        ran_in = rec.program if isinstance(rec, OpRecord) else 0
        if ran_in != program:
            flush(pos, cutter.boundary("program"))  # a program starts or ends: it is a window of its own
            program = ran_in
        if program:
            window.append(pos)                      # whole-program fusion: no size limit, opaque ops run alone
        elif eager and (isinstance(rec, OpRecord) or (in_graph and isinstance(rec, CollectiveRecord)
                                                         and not rec.program)):
            node = op_node(rec) if isinstance(rec, OpRecord) else collective_node(rec)
            reason = cutter.admit(node)
            if reason is not None:
                flush(pos, reason)
            if node.fusible:
                window.append(pos)
            else:
                out.append(rec)
        elif isinstance(rec, HostRecord) and (rec.event == "h2d" or (
                rec.event == "dispatch" and rec.reason not in (BACKWARD_REASON, LAUNCH_REASON)
                and not rec.reason.startswith(MODE_CHANGE_REASON))):
            out.append(rec)                         # a host->device copy fills a fresh buffer: no materialization
        elif isinstance(rec, OpRecord) and compiled_ops and \
                (built := compiled_ops.get(record_signature(rec), _NONE)).records:
            flush(pos, cutter.boundary(_cut_reason(rec)))
            out.extend(_op_kernels(rec, built))
        else:
            flush(pos, cutter.boundary(_cut_reason(rec)))
            out.append(rec)
    flush(len(records), cutter.boundary("end"))
    stats = FusionStats(ops=totals["ops"], kernels=totals["kernels"], windows=cutter.windows,
                        executables=totals["executables"], dropped=totals["dropped"],
                        cuts=dict(sorted(cutter.cuts.items())),
                        materialized=dict(sorted(cutter.materialized.items())), onchip_bytes=float(totals["onchip"]),
                        reused_bytes=float(totals["reused"]), spilled_bytes=float(totals["spilled"]),
                        programs=totals["programs"], program_ops=totals["program_ops"],
                        program_kernels=totals["program_kernels"])
    return Fused(records=tuple(out), stats=stats)


def _interleave(kernels: list[FusedKernel], memory: list[tuple[int, MemoryRecord]],
                emitted: dict[int, int]) -> list[Record]:
    """Kernels in emission order with each memory record where it is safe and tight: an alloc just
    before the first kernel holding an op after it, a free just after the last kernel holding an op
    before it (so every writer follows its alloc and every reader precedes its free)."""
    ops = sorted(emitted)
    first_after = list(itertools.accumulate((emitted[p] for p in reversed(ops)), min, initial=len(kernels)))[::-1]
    last_before = list(itertools.accumulate((emitted[p] for p in ops), max, initial=-1))
    before: dict[int, list[MemoryRecord]] = {}
    after: dict[int, list[MemoryRecord]] = {}
    for q, m in memory:
        cut = bisect.bisect_left(ops, q)        # ops[:cut] ran before the record, ops[cut:] after it
        if m.event == "alloc":
            before.setdefault(first_after[cut], []).append(m)
        else:
            after.setdefault(last_before[cut], []).append(m)
    out: list[Record] = list(after.get(-1, []))
    for i, kernel in enumerate(kernels):
        out += [*before.get(i, []), kernel, *after.get(i, [])]
    return out + before.get(len(kernels), [])


def _on_chip_storages(records: Sequence[Record], flow: _Dataflow, window: list[int], kept: set[int],
                      held: list[MemoryRecord], dead: set[int] = frozenset()) -> set[int]:
    """Storages allocated and freed in this window whose every value stayed on chip, or was made by a dropped
    op: never in HBM."""
    allocated = {m.storage for m in held if m.event == "alloc"}
    freed = {m.storage for m in held if m.event == "free"}
    candidates = allocated & freed
    written: dict[int, bool] = {}
    for pos in window:
        for k, t in enumerate(records[pos].outputs):
            if t.storage in candidates:
                written[t.storage] = written.get(t.storage, True) and (pos in dead or flow.writes[(pos, k)] in kept)
    return {s for s, all_kept in written.items() if all_kept}
