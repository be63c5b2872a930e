"""Fused eager lint: where TorchTPU's DEFER_AND_FUSE cuts a program in a way that hangs or recompiles.

Two findings, each a ``tpusim.report.lint.RULES`` row (``rule(trace, chip, timeline) -> [(message, source)]``):

- ``rank_cluster_cuts``: under ``--ranks all``, the ranks' Fused eager clusters end at different ops. TorchTPU
  compiles each cluster into one executable per rank; when the repeated-op heuristic (or divergent code) cuts one
  rank's program elsewhere, the ranks run different binaries and a collective fused into one of them waits for
  peers that never join it: the job hangs (a public report of a 32-rank TorchTPU job, and TorchTPU's "golden
  rule": never let ranks diverge around materialization).
- ``decode_recompiles``: a ``generate()``-style decode loop (forward passes with no backward whose attention or
  concatenation shapes grow by one along one dim each iteration) gives every step's clusters new shapes, so
  Fused eager compiles every step anew; torch.compile with a static cache compiles once.

Both read the clusters ``tpusim.eager.fusion.fuse`` makes (the cutter both the simulator and the PJRT target
use), only for a program that runs in Fused eager (``uses_fused``).
"""

from __future__ import annotations

from collections.abc import Sequence

from tpusim.eager.compile_cache import CompileCache, with_compiles
from tpusim.eager.fusion import fuse
from tpusim.eager.windows import BACKWARD_REASON
from tpusim.hardware.spec import ChipSpec
from tpusim.pricing.plan import rank_records
from tpusim.pricing.timeline import Timeline
from tpusim.trace.ops import Family, base_name
from tpusim.trace.records import MODE_CHANGE_REASON, CollectiveRecord, HostRecord, OpRecord, Record, Trace

FUSED = "fused"
DECODE_MIN_STEPS = 3            # a decode loop: shapes grow by one at least this many times in a row
GROWING_OPS = frozenset({"cat", "bmm", "baddbmm", "_softmax"})   # besides the attention family: KV cat, scores

Finding = tuple[str, str]


def uses_fused(trace: Trace, timeline: Timeline | None) -> bool:
    """The program runs in Fused eager: it was recorded in it, switched to it, or the mode priced is Fused."""
    if trace.meta.eager_mode == FUSED or (timeline is not None and timeline.policy == FUSED):
        return True
    return any(isinstance(r, HostRecord) and r.reason == MODE_CHANGE_REASON + FUSED for r in trace.records)


# ---- ranks cut differently --------------------------------------------------------------------------------------
def cluster_ends(records: Sequence[Record], chip: ChipSpec) -> list[tuple[int, str, OpRecord | CollectiveRecord]]:
    """Where Fused eager ends each cluster of one rank's program: (index of the cluster's last op among the rank's
    ops and collectives, the cut, that op)."""
    ends: list[tuple[int, str]] = []
    fuse(records, chip, cuts_out=ends)
    ops = [r for r in records if isinstance(r, OpRecord | CollectiveRecord)]
    index = {op.seq: i for i, op in enumerate(ops)}
    return [(index[seq], cut, ops[index[seq]]) for seq, cut in ends if seq in index]


def rank_cluster_cuts(trace: Trace, chip: ChipSpec, timeline: Timeline | None) -> list[Finding]:
    """The first rank whose Fused eager clusters end at other ops than rank 0's, at the first op where they differ."""
    by_rank = rank_records(trace)
    if len(by_rank) < 2 or not uses_fused(trace, timeline):
        return []
    ranks = sorted(by_rank)
    first = cluster_ends(by_rank[ranks[0]], chip)
    for rank in ranks[1:]:
        other = cluster_ends(by_rank[rank], chip)
        pairs = [(a, b) for a, b in zip(first, other) if a[0] != b[0]]
        if pairs:
            a, b = pairs[0]
            ends, goes_on, (where, cut, op) = (ranks[0], rank, a) if a[0] < b[0] else (rank, ranks[0], b)
        elif len(first) != len(other):
            ends, goes_on = (ranks[0], rank) if len(first) > len(other) else (rank, ranks[0])
            where, cut, op = (first if len(first) > len(other) else other)[min(len(first), len(other))]
        else:
            continue
        return [(f"Fused eager cuts rank {ranks[0]}'s and rank {rank}'s programs into different clusters: after "
                 f"{_name(op)} (op {where + 1}) rank {ends} ends a cluster ({cut}) and rank {goes_on} does not. On "
                 f"TorchTPU each rank then compiles and runs different executables, and a collective fused into one "
                 f"of them waits for peers that never join it (a hang). Make every rank run the same ops between host "
                 f"reads, or keep collectives out of fused graphs (TORCH_TPU_INTERNAL_MATERIALIZE_COLLECTIVE_TENSORS="
                 f"1, the default) and run the diverging part in DEFER_NEVER", op.source)]
    return []


def _name(rec: OpRecord | CollectiveRecord) -> str:
    return rec.op if isinstance(rec, OpRecord) else rec.collective


# ---- decode loops -----------------------------------------------------------------------------------------------
def decode_recompiles(trace: Trace, chip: ChipSpec, timeline: Timeline | None) -> list[Finding]:
    """A decode loop under Fused eager (see the module docstring): its steps and the cluster signatures each
    step compiles anew."""
    records = next(iter(rank_records(trace).values()), ())
    if not records or not uses_fused(trace, timeline) or has_backward(records):
        return []
    growing = growing_op(records)
    if growing is None:
        return []
    starts, op, dim = growing
    cache = CompileCache()
    planned = with_compiles(fuse(records, chip).records, chip, cache)
    per_step = [0] * len(starts)
    for rec in planned:
        if isinstance(rec, HostRecord) and rec.reason == "compile" and rec.seq >= starts[0]:
            per_step[sum(1 for s in starts if s <= rec.seq) - 1] += 1
    later = per_step[1:]
    count = f"{min(later)}" if min(later) == max(later) else f"{min(later)}-{max(later)}"
    return [(f"a decode loop under Fused eager: {base_name(op.op)}'s input grows by one along dim {dim} each step "
             f"({len(starts)} steps), so every step's clusters have new shapes and compile anew: "
             f"{count} new cluster signatures per step after the first "
             f"({cache.clusters_compiled} distinct in all). Use torch.compile with a static cache (a fixed-size KV "
             f"cache, e.g. generate(..., cache_implementation=\"static\")): one program for every step", op.source)]


def has_backward(records: Sequence[Record]) -> bool:
    """Whether a backward ran: a decode loop never runs one, a training step always does."""
    return any((isinstance(r, HostRecord) and r.reason == BACKWARD_REASON)
               or (isinstance(r, OpRecord) and "backward" in r.op) for r in records)


def growing_op(records: Sequence[Record]) -> tuple[list[int], OpRecord, int] | None:
    """The attention or concatenation call (op and line) whose first input grows by one along one dim from one
    decode step to the next, ``DECODE_MIN_STEPS`` steps in a row or more: the seq each of those steps starts at,
    the op, the dim."""
    shapes: dict[tuple[str, str], list[tuple[tuple[int, ...], OpRecord]]] = {}
    for rec in records:
        if isinstance(rec, OpRecord) and rec.inputs and not rec.program and (
                rec.family == Family.ATTENTION or base_name(rec.op) in GROWING_OPS):
            seen = shapes.setdefault((base_name(rec.op), rec.source), [])
            if not seen or seen[-1][0] != rec.inputs[0].shape:
                seen.append((rec.inputs[0].shape, rec))
    best: tuple[list[int], OpRecord, int] | None = None
    for seen in shapes.values():
        dims = [grown_dim(a, b) for (a, _), (b, _) in zip(seen, seen[1:])]
        start = 0
        for i in range(len(dims) + 1):              # runs of one grown dim: dims[start:i] all equal, not None
            if i < len(dims) and dims[i] is not None and dims[i] == dims[start]:
                continue
            run = seen[start:i + 1] if start < len(dims) and dims[start] is not None else []
            if len(run) >= DECODE_MIN_STEPS and (best is None or len(run) > len(best[0])):
                best = ([rec.seq for _, rec in run], run[0][1], dims[start])
            start = i
    return best


def grown_dim(old: tuple[int, ...], new: tuple[int, ...]) -> int | None:
    """The one dim that grew by exactly one from ``old`` to ``new`` (the rest equal), else None."""
    if len(old) != len(new):
        return None
    changed = [d for d, (a, b) in enumerate(zip(old, new)) if a != b]
    return changed[0] if len(changed) == 1 and new[changed[0]] == old[changed[0]] + 1 else None
