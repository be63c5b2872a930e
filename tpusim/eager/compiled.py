"""Handing clusters to a compiler: what the TPU compiler built, run in place of tpusim's own grouping.

Why its own module: fusion forms clusters and costs them as fused kernels (``tpusim.eager.clusters``,
``tpusim.eager.cluster_cost``); when the TPU compiler (``tpusim.xla``) compiled the same work, its kernels
and collectives run instead, in the same places. ``CompilerOutput`` is the one typed value of everything it
built for a trace, by what each program stands in for:

- **compiled programs** (a torch.compile'd graph's executions, ``OpRecord.program``): XLA's kernels in its
  schedule (``compiled_kernels``); a graph with collectives compiled whole stands for several executions
  (``CompiledProgram.spans``, ``whole_graph_spans``);
- **eager ops** (by ``record_signature``): where ops stay one executable each (Strict, Debug), the kernels of
  the op's one-op program (``op_kernels``);
- **Fused eager clusters** (by ``ClusterCall``, which ``cluster_call`` makes of a cluster's ops): the
  cluster's program.

Anything the compiler did not build is priced by tpusim's model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tpusim.eager.cluster_cost import FusedKernel, cost_kernel
from tpusim.eager.dataflow import Dataflow
from tpusim.hardware.spec import ChipSpec
from tpusim.trace.records import CollectiveRecord, OpRecord, Record, TensorMeta, record_signature


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
class CompilerOutput:
    """Everything the TPU compiler built for one trace (``tpusim.xla.programs.XlaEstimates``), as one value that
    pricing passes down whole: each compiled program execution (``OpRecord.program``), eager op signature
    (``record_signature``) and Fused eager cluster (``ClusterCall``) -> what XLA built for it. Empty: tpusim's
    model prices everything."""

    programs: Mapping[int, CompiledProgram] = field(default_factory=dict)
    ops: Mapping[str, CompiledProgram] = field(default_factory=dict)
    clusters: Mapping[ClusterCall, CompiledProgram] = field(default_factory=dict)

    def program(self, number: int) -> CompiledProgram:
        """What XLA built for program execution ``number`` (empty records: nothing)."""
        return self.programs.get(number, NOTHING)

    def op(self, rec: OpRecord) -> CompiledProgram:
        """The one-op program XLA built for an eager op's signature (empty records: nothing)."""
        return self.ops.get(record_signature(rec), NOTHING) if self.ops else NOTHING

    def cluster(self, call: ClusterCall | None) -> CompiledProgram:
        """The program XLA built for a Fused eager cluster (empty records: nothing)."""
        return self.clusters.get(call, NOTHING) if call is not None else NOTHING


NOTHING = CompiledProgram(())
MODEL_ONLY = CompilerOutput()       # the compiler built nothing: tpusim's model prices every program


def compiled_kernels(records: Sequence[Record], flow: Dataflow, window: list[int], end: int, chip: ChipSpec,
                      number: int, built: Sequence[OpRecord | CollectiveRecord],
                      recorded: Sequence[CollectiveRecord] = ()) -> tuple[list[Record], dict[int, int]]:
    """What the TPU compiler built for program execution ``number``, placed where its ops ran: the first kernel
    reads what enters the program, the last writes what leaves it (so what waits for them still waits), its
    collectives run over the group the recorded ones used, and the program's ops spread over its records in
    order (where its memory records go)."""
    whole, _ = cost_kernel(records, flow, window, end, chip)
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



def op_kernels(op: OpRecord, built: CompiledProgram) -> list[FusedKernel]:
    """An eager op run as the kernels XLA compiled its one-op program to: the first reads its inputs, is
    dispatched and compiled as the op (its only part), the last writes its outputs."""
    kernels = [k for k in built.records if isinstance(k, FusedKernel)]
    last = len(kernels) - 1
    return [dataclasses.replace(k, seq=op.seq, rank=op.rank, source=op.source, program=0,
                                inputs=op.inputs if i == 0 else (), outputs=op.outputs if i == last else (),
                                parts=(op,) if i == 0 else (), follows=i > 0)
            for i, k in enumerate(kernels)]


def whole_graph_spans(records: Sequence[Record], compiled: Mapping[int, CompiledProgram]) -> dict[int, int]:
    """Each graph compiled whole (``CompiledProgram.spans`` > 1): position of its first op -> of its last."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for pos, rec in enumerate(records):
        if isinstance(rec, OpRecord | CollectiveRecord) and rec.program:
            first.setdefault(rec.program, pos)
            last[rec.program] = pos
    return {first[n]: max(last[n + i] for i in range(c.spans) if n + i in last) for n, c in compiled.items()
            if c.spans > 1 and c.records and n in first}

