"""Costing a cluster: its ops grouped into fused kernels, each priced by the bytes it moves.

Why: every eager op on a TPU is one kernel launch that reads its inputs from HBM and writes its outputs back. A
fused kernel pays one launch and keeps the values that never leave it in on-chip memory, so a chain of small
elementwise ops costs about what its first input and last output cost to move. ``grouped`` is this module's
answer for one cluster (or one compiled program's window); ``tpusim.eager.fusion.fuse`` chains it after
forming the clusters (``tpusim.eager.clusters``).

**Grouping.** Within a window, ops are taken in program order and grouped by data
dependence (which write of which storage id each input reads: ``tpusim.eager.dataflow``). An op joins the
kernel(s) that produced its inputs when the rules of its role allow (``RULES``):

- elementwise ops join their producers (chains, and prologues/epilogues of anchors);
- a reduction joins its producers (elementwise prologue); later elementwise ops join it
  (epilogue); at most one anchor (reduction or contraction) per kernel;
- a contraction (matmul, convolution: the MXU) never takes its producers into its kernel
  (no prologue), but elementwise consumers join it as epilogues.

If an op reads from several kernels, they merge when the merged kernel keeps one anchor,
keeps contractions without prologue, and creates no cycle (a kernel outside it that needs
it and that it needs); otherwise the op joins its most recent compatible producer, or
starts a kernel. Write-after-read and write-after-write on a storage are ordering edges
too. Kernels are emitted in a dependency order (earliest first op first). Inside a compiled program an
int8/fp8 matmul takes its quantize work as its prologue (``PROGRAM_PROLOGUES``), and a float matmul the
dequantize of an int8/fp8 operand, as XLA fuses both.

**Bytes.** A fused kernel reads each value that enters it once and writes the values that
leave it. A value produced in the kernel is read from on chip by the kernel's own ops; it
stays on chip (its write is not counted) when all its readers are in the kernel and it dies
inside the window: its storage is freed, or wholly overwritten, before the window ends. A
value read later (saved for backward, read by a collective or another kernel) or still held
by the user when the window ends leaves the kernel: the user may read it (``.cpu()`` does not
name the tensors it copies, so "held at the cut" is the safe test). An empty tensor read in a cluster is a
constant re-emitted there, not an HBM read.

**On-chip capacity.** XLA tiles a fused kernel: a value made and used inside it streams through
VMEM a tile at a time and never needs room for the whole tensor. The exception is a reduction
whose result is read inside the same kernel (``x / x.abs().amax()``, softmax, an int8 quantize):
the kernel runs in phases, each reduction ending one, and a value read in a later phase than the
one that made it (or an entering value read in two phases) must be held whole across the
barrier. Held values must fit ``chip.vmem_bytes`` (one TensorCore's VMEM) together; when they do
not, the largest go through HBM: a held intermediate's write and its reads, an entering value's
read once more per later phase (``spilled_bytes``). The kernel is not split, so its launch count
stays.

**Memory records** of a window stay as close to their ops as the kernel order allows (``interleave``): an
alloc goes just before the first kernel holding an op that followed it, a free just after
the last kernel holding an op that preceded it. The alloc/free pairs of storages whose every
value stayed on chip are dropped (``on_chip_storages``: they never touch HBM).

Adding a fusion rule = one row in ``tpusim.trace.ops.OPS`` (what an op is) or ``RULES`` (what a
role may fuse with).
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from tpusim.eager.dataflow import CONSTANT, Dataflow
from tpusim.hardware.compute import itemsize
from tpusim.hardware.spec import ChipSpec
from tpusim.trace.ops import base_name, fusion_role
from tpusim.trace.records import CollectiveRecord, MemoryRecord, OpRecord, Record, TensorMeta

MAX_NAME_PARTS = 6               # a kernel name lists at most this many op names


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

    def __init__(self, records: Sequence[Record], flow: Dataflow, program: bool = False) -> None:
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
def cost_kernel(records: Sequence[Record], flow: Dataflow, members: list[int], end: int,
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


def _constant_bytes(flow: Dataflow, pos: int, op: OpRecord) -> int:
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


def _spill(held: set[int], flow: Dataflow, capacity: int) -> set[int]:
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


def grouped(records: Sequence[Record], flow: Dataflow, members: list[int], end: int, chip: ChipSpec,
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
            kernel, on_chip = cost_kernel(records, flow, group, end, chip)
            if cluster:
                kernel = dataclasses.replace(kernel, cluster=cluster, cut=cut, window=window)
            kept |= on_chip
        emitted.update(dict.fromkeys(group, len(kernels)))
        kernels.append(kernel)
    return kernels, kept, emitted



def interleave(kernels: list[FusedKernel], memory: list[tuple[int, MemoryRecord]],
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


def on_chip_storages(records: Sequence[Record], flow: Dataflow, window: list[int], kept: set[int],
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
