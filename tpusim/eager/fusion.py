"""Fused eager: form clusters, cost each as fused kernels (or take what the TPU compiler built), in one pass.

``fuse(records, chip)`` is a pure trace transform; ``tpusim.eager.modes`` turns it into the Fused eager
policy and ``tpusim.pricing.planning`` runs it for every mode (compiled programs are fused in all of them).
It chains three named steps, each a module of its own:

1. **forming** (``tpusim.eager.clusters``): the stream cut into windows, TorchTPU's clusters (the cutter,
   ``tpusim.eager.windows``), and each compiled program's execution a window of its own; each eager cluster
   then loses its dead ops and splits into TorchTPU's executables;
2. **costing** (``tpusim.eager.cluster_cost``): an executable's ops grouped into fused kernels, each priced
   by the bytes it moves (what stays on chip, what spills), memory records placed between them;
3. **the compiler's kernels** (``tpusim.eager.compiled``): where the TPU compiler built a program, an eager
   op's one-op program or a cluster (``CompilerOutput``), its kernels and collectives run in that place
   instead of step 2's.

Each kernel carries its executable's number, its cluster's and the rule that ended it
(``FusedKernel.cluster``, ``.window``, ``.cut``): the compile cache keys an executable as one region. A
compiled program is launched once: one ``dispatch`` host record (reason ``PROGRAM_REASON``) of one op's
dispatch time, and its kernels cost no host time of their own (``tpusim.eager.modes``); an eager window adds
the host's recording time (``WINDOW_REASON``).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from tpusim.eager.cluster_cost import (
    PROGRAM_PROLOGUES,
    RULES,
    WIDE_FLOATS,
    FusedKernel,
    Rule,
    cost_kernel,
    grouped,
    interleave,
    on_chip_storages,
    role_of,
)
from tpusim.eager.clusters import (
    COLLECTIVE_PREFIX,
    Alone,
    Window,
    collective_node,
    dead_ops,
    executables,
    form_windows,
    op_node,
)
from tpusim.eager.compiled import (
    MODEL_ONLY,
    ClusterCall,
    CompiledProgram,
    CompilerOutput,
    cluster_call,
    compiled_kernels,
    op_kernels,
    whole_graph_spans,
)
from tpusim.eager.dataflow import Dataflow
from tpusim.hardware.spec import ChipSpec
from tpusim.trace.records import CollectiveRecord, HostRecord, OpRecord, Record

__all__ = ["COLLECTIVE_PREFIX", "PROGRAM_PROLOGUES", "PROGRAM_REASON", "RULES", "WIDE_FLOATS", "WINDOW_REASON",
           "ClusterCall", "CompiledProgram", "CompilerOutput", "Fused", "FusedKernel", "FusionStats", "Rule",
           "cluster_call", "collective_node", "fuse", "op_node", "role_of"]

WINDOW_REASON = "fused_window"   # HostRecord reason of the host time spent recording a window
PROGRAM_REASON = "program_launch"  # HostRecord reason of a compiled program's one launch


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


def fuse(records: Sequence[Record], chip: ChipSpec, *, host_s_per_op: float = 0.0, eager: bool = True,
         compiled: CompilerOutput = MODEL_ONLY, clusters_out: list[tuple[int, int, ClusterCall]] | None = None,
         cuts_out: list[tuple[int, str]] | None = None) -> Fused:
    """Group ``records`` into fused kernels: form the windows, then run each (see the module docstring).

    ``host_s_per_op`` > 0 adds, at each window's flush, one ``dispatch`` host record of that many seconds per op
    in the window (reason ``WINDOW_REASON``): the host recording the window while the device waits for it.
    ``eager=False`` fuses only compiled programs (Debug and Strict: their eager ops stay one kernel each).
    ``compiled``: what the TPU compiler built, run in place of this grouping. ``clusters_out``, when given,
    collects each executable's (number, first op's seq, call) for the compiler to compile; ``cuts_out``, each
    eager cluster's (last op's seq, the cut that ended it)."""
    records = list(records)
    formed = form_windows(records, eager=eager, spans=whole_graph_spans(records, compiled.programs))
    run = _Run(records, Dataflow(records), chip, compiled, host_s_per_op, clusters_out, cuts_out)
    out: list[Record] = []
    for item in formed.items:
        if isinstance(item, Window):
            out += run.window(item)
        elif isinstance(item, Alone):
            built = compiled.op(item.record)
            out += op_kernels(item.record, built) if built.records else [item.record]
        else:
            out.append(item)
    t = run.totals
    stats = FusionStats(ops=t["ops"], kernels=t["kernels"], windows=formed.windows, executables=t["executables"],
                        dropped=t["dropped"], cuts=formed.cuts, materialized=formed.materialized,
                        onchip_bytes=float(t["onchip"]), reused_bytes=float(t["reused"]),
                        spilled_bytes=float(t["spilled"]), programs=t["programs"], program_ops=t["program_ops"],
                        program_kernels=t["program_kernels"])
    return Fused(records=tuple(out), stats=stats)


@dataclass
class _Run:
    """Running one stream's windows: each one's kernels (tpusim's grouping or the compiler's), host records and
    memory records, with the counts for ``FusionStats``."""

    records: list[Record]
    flow: Dataflow
    chip: ChipSpec
    compiled: CompilerOutput
    host_s_per_op: float
    clusters_out: list[tuple[int, int, ClusterCall]] | None
    cuts_out: list[tuple[int, str]] | None
    totals: Counter = field(default_factory=Counter)

    def window(self, w: Window) -> list[Record]:
        """A window's records in run order: its launch or recording host record, then its kernels with its
        memory records between them (those of storages that never reached HBM dropped)."""
        kernels, kept, emitted, dead = self._kernels(w)
        dropped = on_chip_storages(self.records, self.flow, w.positions, kept, [m for _, m in w.memory], dead)
        first = self.records[w.positions[0]]
        out: list[Record] = []
        if w.program:
            out.append(HostRecord(seq=first.seq, event="dispatch", reason=PROGRAM_REASON,
                                  seconds=self.chip.host_dispatch_ns / 1e9, source=first.source, rank=first.rank))
            self.totals.update(programs=1, program_ops=len(w.positions), program_kernels=len(kernels))
        else:
            if self.host_s_per_op > 0:              # the host recorded every op, the dropped ones too
                out.append(HostRecord(seq=first.seq, event="dispatch", reason=WINDOW_REASON,
                                      seconds=len(w.positions) * self.host_s_per_op, source=first.source,
                                      rank=first.rank))
            ran = [k for k in kernels if isinstance(k, OpRecord)]
            self.totals.update(ops=len(w.positions) - len(dead), kernels=len(ran), dropped=len(dead))
        out.extend(interleave(kernels, [(q, m) for q, m in w.memory if m.storage not in dropped], emitted))
        fused = [k for k in kernels if isinstance(k, FusedKernel)]
        self.totals.update(onchip=sum(k.onchip_bytes for k in fused), reused=sum(k.reused_bytes for k in fused),
                           spilled=sum(k.spilled_bytes for k in fused))
        return out

    def _kernels(self, w: Window) -> tuple[list[Record], set[int], dict[int, int], set[int]]:
        """The window's kernels, the values they keep on chip, each op's kernel index and the dropped ops: a
        compiled program as XLA built it (else grouped whole), an eager cluster executable by executable."""
        records, flow, chip = self.records, self.flow, self.chip
        built = self.compiled.program(w.program)
        if built.records:
            made, emitted = compiled_kernels(records, flow, w.positions, w.end, chip, w.program, built.records,
                                             w.collectives)
            return made, set(), emitted, set()
        if w.program:
            return (*grouped(records, flow, w.positions, w.end, chip, 0, "", program=True), set())
        if self.cuts_out is not None:
            self.cuts_out.append((records[w.positions[-1]].seq, w.cut))
        dead = dead_ops(records, flow, w.positions, w.end)
        chunks = executables(records, flow, [p for p in w.positions if p not in dead], w.end, w.cut)
        dead |= set(w.positions) - {p for chunk in chunks for p in chunk}
        kernels: list[Record] = []
        kept: set[int] = set()
        emitted: dict[int, int] = {}
        for chunk in chunks:
            self.totals["executables"] += 1
            made, on_chip, placed = self._executable(chunk, w, self.totals["executables"])
            emitted.update({p: len(kernels) + i for p, i in placed.items()})
            kernels += made
            kept |= on_chip
        return kernels, kept, emitted, dead

    def _executable(self, chunk: list[int], w: Window, number: int) -> tuple[list[Record], set[int], dict[int, int]]:
        """The kernels of one executable of an eager cluster (``number``): what the TPU compiler built for it,
        else tpusim's grouping; a collective kept in the graph runs as itself, in its place."""
        records, flow, chip = self.records, self.flow, self.chip
        call = None
        if (self.compiled.clusters or self.clusters_out is not None) and \
                not any(isinstance(records[p], CollectiveRecord) for p in chunk):
            call = cluster_call([records[p] for p in chunk], cost_kernel(records, flow, chunk, w.end, chip)[0].outputs)
            if self.clusters_out is not None:
                self.clusters_out.append((number, records[chunk[0]].seq, call))
        built = self.compiled.cluster(call)
        if built.records:
            kernels, emitted = compiled_kernels(records, flow, chunk, w.end, chip, 0, built.records)
            parts = tuple(records[p] for p in chunk)        # compiled as the cluster's ops: its region and cost
            return [dataclasses.replace(k, cluster=number, cut=w.cut, window=w.number, parts=parts if i == 0 else ())
                    for i, k in enumerate(kernels)], set(), emitted
        return grouped(records, flow, chunk, w.end, chip, number, w.cut, window=w.number)
