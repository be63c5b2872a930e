"""Forming clusters: a record stream cut into windows, and each eager window into TorchTPU's executables.

Why its own step: where a cluster ends decides what is compiled and launched together, before anything is
priced; the cutter (``tpusim.eager.windows.WindowCutter``) is shared with the PJRT fused target, and what each
cluster then costs is ``tpusim.eager.cluster_cost``'s (or the TPU compiler's, ``tpusim.eager.compiled``).

**Windows** (TorchTPU's clusters: what the host defers before anything runs) end where
``tpusim.eager.windows.WindowCutter`` says: at host syncs, collectives (unless TorchTPU's
``TORCH_TPU_INTERNAL_MATERIALIZE_COLLECTIVE_TENSORS=0`` keeps them in the graph, where a collective runs as
itself among the cluster's kernels), host reads, step markers, a change of eager mode, the end of
backward(), and by TorchTPU's heuristics (stale, forced split, dynamic shapes, random draws, repeated
layers; the cutter's docstring says what each does; a value with two consumers is an output of its
cluster, not a cut). Every op TorchTPU lowers stays in its cluster (gathers, copies, fills, sorts: fusion's
opaque role makes each a kernel of its own there); a host->device copy fills a fresh buffer and cuts
nothing. ``op_node`` is what the cutter sees of an op (the PJRT fused target feeds it the same for the ops
it runs, so both make the same clusters).

**Compiled programs** (ops recorded with ``program`` > 0: one execution of a torch.compile'd graph) are a
window of their own in every mode, with no size limit: XLA sees the whole graph; a graph the compiler built
whole (``spans``) is one window over its segments and the collectives recorded between them.

**Executables.** When an eager cluster runs, its **dead** ops (nothing held or read what they made:
TorchTPU's queue holds them by weak references) are dropped unpriced (``dead_ops``), and the rest run as
TorchTPU's executables (``executables``, ``tpusim.eager.windows.splits_graph``): one per materialization
point (a value held at the cut, or read past the next such point) unless a repeat cut under ``aggressive``
compiles the cluster whole.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tpusim.eager.dataflow import Dataflow
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
from tpusim.trace.ops import base_name
from tpusim.trace.records import (
    MODE_CHANGE_REASON,
    CollectiveRecord,
    HostRecord,
    MemoryRecord,
    OpRecord,
    Record,
    StepMarker,
)

COLLECTIVE_PREFIX = "c10d::"     # a collective's name as a node of the fused graph


@dataclass
class Window:
    """One window of the stream, run together: an eager cluster, or one compiled program's execution."""

    positions: list[int]                         # its ops (and collectives kept in the graph), in program order
    memory: list[tuple[int, MemoryRecord]]       # (position, record) of the memory records recorded while open
    end: int                                     # the position where it ended: a value alive there leaves it
    cut: str                                     # why it ended (a tpusim.eager.windows.CUTS key)
    program: int = 0                             # the compiled program execution it holds; 0: eager ops
    number: int = 0                              # the cutter's count of eager clusters when it ended
    collectives: tuple[CollectiveRecord, ...] = ()   # a graph compiled whole: the collectives recorded in it


@dataclass(frozen=True)
class Alone:
    """An eager op run as an executable of its own outside any window (Strict and Debug; an opaque op)."""

    record: OpRecord


@dataclass(frozen=True)
class Formed:
    """A stream as windows and the records between them, in the order they run; the cutter's counts."""

    items: tuple[Record | Window | Alone, ...]
    windows: int = 0                             # eager clusters (materializations of the deferred graph)
    cuts: dict[str, int] = field(default_factory=dict)          # why clusters ended
    materialized: dict[str, int] = field(default_factory=dict)  # values made cluster outputs, by why


def form_windows(records: Sequence[Record], *, eager: bool = True, spans: Mapping[int, int] | None = None
                 ) -> Formed:
    """Cut ``records`` into windows (see the module docstring). ``eager=False``: only compiled programs form
    windows (Debug and Strict: eager ops run alone); ``spans``: each graph compiled whole, position of its first
    op -> of its last (``tpusim.eager.compiled.whole_graph_spans``)."""
    spans = spans or {}
    items: list[Record | Window | Alone] = []
    window: list[int] = []
    held: list[tuple[int, MemoryRecord]] = []       # (position, record) of the window's memory records
    collectives: list[CollectiveRecord] = []        # a whole graph's recorded collectives
    program = 0                                     # the compiled program the window holds; 0: eager ops
    cutter = WindowCutter()
    in_graph = not materialize_collectives()        # collectives are nodes of the fused graph

    def flush(end: int, reason: str) -> None:
        if not window:
            items.extend(m for _, m in held)
            held.clear()
            return
        items.append(Window(list(window), list(held), end, reason, program, cutter.windows, tuple(collectives)))
        window.clear()
        held.clear()
        collectives.clear()

    span_end = -1
    for pos, rec in enumerate(records):
        if pos in spans:                            # XLA's one program stands for the segments and collectives
            flush(pos, cutter.boundary("program"))
            program, span_end = rec.program, spans[pos]
        if pos <= span_end:
            if isinstance(rec, OpRecord):
                window.append(pos)
            elif isinstance(rec, CollectiveRecord):
                collectives.append(rec)
            elif isinstance(rec, MemoryRecord):
                held.append((pos, rec))
            else:
                items.append(rec)
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
                items.append(rec)
        elif isinstance(rec, HostRecord) and (rec.event == "h2d" or (
                rec.event == "dispatch" and rec.reason not in (BACKWARD_REASON, LAUNCH_REASON)
                and not rec.reason.startswith(MODE_CHANGE_REASON))):
            items.append(rec)                       # a host->device copy fills a fresh buffer: no materialization
        else:
            flush(pos, cutter.boundary(cut_reason(rec)))
            items.append(Alone(rec) if isinstance(rec, OpRecord) else rec)
    flush(len(records), cutter.boundary("end"))
    return Formed(tuple(items), cutter.windows, dict(sorted(cutter.cuts.items())),
                  dict(sorted(cutter.materialized.items())))


def cut_reason(rec: Record) -> str:
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



def dead_ops(records: Sequence[Record], flow: Dataflow, window: list[int], end: int) -> set[int]:
    """The window's ops TorchTPU drops (events_queue.cc: the queue holds a deferred op by a weak reference):
    no value they make is held at the cut or read by an op that runs. Collectives (side effects) and ops
    that make nothing always run."""
    members = set(window)
    dead: set[int] = set()
    for pos in reversed(window):
        rec = records[pos]
        if isinstance(rec, CollectiveRecord) or not rec.outputs:
            continue
        values = flow.outputs(pos, rec)
        if not any(v.death is None or v.death >= end or any(r not in dead and (r in members or r >= end)
                                                              for r in v.readers) for v in values):
            dead.add(pos)
    return dead


def executables(records: Sequence[Record], flow: Dataflow, members: list[int], end: int,
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
        if nodes and one_dispatch(records[nodes[-1][-1]], records[pos]):
            nodes[-1].append(pos)
        else:
            nodes.append([pos])
    node_of = {pos: i for i, node in enumerate(nodes) for pos in node}
    outputs, last_read = [], []
    for node in nodes:
        required, last = False, -1
        for pos in node:
            rec = records[pos]
            values = flow.outputs(pos, rec)
            required = required or isinstance(rec, CollectiveRecord) or not values or \
                any(v.death is None or v.death >= end for v in values)
            last = max([last, *(node_of.get(r, len(nodes) if r >= end else -1) for v in values for r in v.readers)])
        outputs.append(required)
        last_read.append(last)
    return [[pos for i in chunk for pos in nodes[i]] for chunk in materialization_chunks(outputs, last_read)]


def one_dispatch(before: Record, rec: Record) -> bool:
    """Two consecutive records of one ``_foreach_`` dispatch: the same op from the same line."""
    return isinstance(before, OpRecord) and isinstance(rec, OpRecord) and bool(rec.source) and \
        before.source == rec.source and base_name(before.op) == base_name(rec.op)

