"""What the simulator runs: a ModePlan, the record streams an eager mode made of a trace.

Why a type of its own: pricing is one way down, ``tpusim.pricing.planning`` (the mode's rewrite of a
trace: result checks, fusion, compiles) makes a ModePlan and ``tpusim.pricing.engine.simulate`` runs it,
without calling back into the mode. A ModePlan says, per simulated rank, which records the host
issues, how much host time each costs to issue, and how far the host may run ahead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tpusim.hardware.spec import ChipSpec
from tpusim.trace.records import CollectiveRecord, HostRecord, OpRecord, Record, Trace, rank_records


@dataclass(frozen=True)
class RankStream:
    """One rank's records and the host seconds to issue each."""

    records: tuple[Record, ...]
    dispatch_s: tuple[float, ...]


@dataclass(frozen=True)
class ModePlan:
    """A trace as a mode runs it (see the module docstring); ``meta`` is what the mode reports
    (its compile cache, its fusion), from the first simulated rank."""

    mode: str
    streams: dict[int, RankStream]          # simulated rank -> its stream; one rank stands for all (SPMD)
    world_size: int
    queue_depth: int = 1024
    sync_each_op: bool = False
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def symmetric(self) -> bool:
        """One recorded rank stands for every rank (SPMD by symmetry)."""
        return len(self.streams) == 1


def issue_seconds(record: Record, chip: ChipSpec) -> float:
    """Host time to issue one record as recorded: one dispatch per op or collective, and explicit
    host time for ``dispatch`` host records."""
    if isinstance(record, OpRecord | CollectiveRecord):
        return chip.host_dispatch_ns / 1e9
    if isinstance(record, HostRecord) and record.event == "dispatch":
        return record.seconds
    return 0.0


def raw_plan(trace: Trace, chip: ChipSpec, *, queue_depth: int = 1024, sync_each_op: bool = False,
             name: str = "raw") -> ModePlan:
    """The trace as recorded, no mode's rewrite (no compile cache, no checks, no fusion): for testing
    the engine's queue alone. Priced eager modes come from ``tpusim.pricing.planning.plan``."""
    streams = {rank: stream(records, [issue_seconds(r, chip) for r in records])
               for rank, records in rank_records(trace).items()}
    return ModePlan(name, streams, trace.world_size, queue_depth, sync_each_op)


def stream(records: Sequence[Record], dispatch_s: Sequence[float]) -> RankStream:
    return RankStream(tuple(records), tuple(dispatch_s))
