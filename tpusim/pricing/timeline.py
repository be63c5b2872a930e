"""What a simulation returns: the Timeline of one priced program, and the step-time rule.

Why a module of its own: the report, lint, placement and comparison read timelines; they
should not depend on the simulator that made them (``tpusim.pricing.engine``). Everything here is
plain data: frozen dataclasses, tuples, dicts of numbers. Each op event carries its
``KernelCost`` (``tpusim.hardware.compute``), so readers use the price the simulation used.

**Steps.** ``step_stats`` is the one rule for first and median step, for simulated and
measured steps alike: the median leaves the first step (compiles, warm-up) out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median
from typing import Any

from tpusim.hardware.compute import KernelCost
from tpusim.hardware.memory import MemoryTimeline
from tpusim.network.collectives import CollectiveResult
from tpusim.network.links import LinkStats

TRACKS = ("host", "tensorcore", "sparsecore", "ici", "pcie")


@dataclass(frozen=True)
class Event:
    """One interval on one track of one chip. ``kind`` says what filled it:
    op, collective, wait (device blocked on a collective or async work), dispatch,
    stall (host waiting for the device), transfer (host<->device copy), host (explicit host time),
    compile (host compiling a region on a compile-cache miss)."""

    start_s: float
    end_s: float
    track: str
    chip: int
    name: str
    kind: str
    bytes: float = 0.0
    flops: float = 0.0
    source: str = ""
    seq: int = -1
    bound: str = ""           # ops: what limited the kernel (compute.BOUNDS); stalls: the reason
    cost: KernelCost | None = None   # ops: the kernel's priced cost (readers never price again)
    dtype: str = ""           # ops: the dtype whose MXU peak the kernel ran at (int8 matmuls: int8's)

    @property
    def seconds(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True)
class StepTime:
    """A training step: from the previous step's end (or 0) until all its device work is done."""

    step: int
    start_s: float
    end_s: float

    @property
    def seconds(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True)
class CollectiveRun:
    """One collective as it ran: when, issued from where, and what the network said about it."""

    seq: int
    chip: int
    kind: str
    rank_bytes: int           # this rank's input buffer, as recorded
    group_size: int
    async_op: bool
    issued_s: float           # when the chip's device queue reached it
    start_s: float            # when it started (later than issued_s when MPMD ranks arrive late)
    end_s: float
    source: str
    result: CollectiveResult


@dataclass(frozen=True)
class Timeline:
    """What ``simulate`` returns: every event plus the totals a report needs."""

    events: tuple[Event, ...]
    total_s: float
    steps: tuple[StepTime, ...]
    busy_s: dict[str, float]              # track -> busy time (union of its intervals; mean over chips)
    time_by_bound: dict[str, float]       # device op time by limiting term (mxu, hbm, launch, ...)
    host_dispatch_s: float
    host_stall_s: float
    host_transfer_s: float
    collectives: tuple[CollectiveRun, ...]
    memory: dict[int, MemoryTimeline]     # chip -> HBM live bytes
    link_stats: LinkStats | None          # per ICI/DCN channel; None when nothing used the network
    chips_simulated: tuple[int, ...]
    world_size: int
    symmetric: bool                       # True: one chip stood for every rank (SPMD)
    policy: str
    kernels: int
    meta: dict[str, Any] = field(default_factory=dict)   # the policy's ModePlan.meta (first simulated chip)
    host_compile_s: float = 0.0                          # host time compiling regions (compile-cache misses)

    @property
    def peak_hbm_bytes(self) -> int:
        return max((m.peak_bytes for m in self.memory.values()), default=0)

    @property
    def collective_exposed_s(self) -> float:
        """Device time spent waiting for collectives (per simulated chip, averaged)."""
        waits = sum(e.seconds for e in self.events if e.kind == "wait" and e.bound == "collective")
        return waits / max(1, len(self.chips_simulated))

    @property
    def collective_hidden_s(self) -> float:
        """Collective time under compute (async collectives the device did not wait for): ``collective_s``
        less the exposed waits."""
        return max(0.0, self.collective_s - self.collective_exposed_s)

    @property
    def collective_s(self) -> float:
        """Time some collective was running (union over all collectives, per simulated chip, averaged)."""
        return self.busy_s.get("ici", 0.0)

    @property
    def hbm_bytes_moved(self) -> float:
        """HBM bytes read + written by all kernels (per simulated chip, averaged)."""
        return sum(e.bytes for e in self.events if e.kind == "op") / max(1, len(self.chips_simulated))

    def events_on(self, track: str, chip: int | None = None) -> list[Event]:
        return [e for e in self.events if e.track == track and (chip is None or e.chip == chip)]


@dataclass(frozen=True)
class StepStats:
    """First and median step of a run (``step_stats``)."""

    first_s: float | None       # None: the program marked no steps
    median_s: float | None      # median of the steps after the first; one step is its own median;
                                # no steps: the whole run (``total_s``)


def step_stats(steps_s: tuple[float, ...] | list[float], total_s: float | None) -> StepStats:
    """The one step-time rule (see the module docstring), for simulated and measured steps alike."""
    steps = list(steps_s)
    if not steps:
        return StepStats(None, total_s)
    return StepStats(steps[0], median(steps[1:]) if len(steps) > 1 else steps[0])


def union_length(spans: list[tuple[float, float]]) -> float:
    """Total length covered by sorted (start, end) intervals."""
    total, cur_start, cur_end = 0.0, None, None
    for s, e in spans:
        if cur_end is None or s > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = s, e
        else:
            cur_end = max(cur_end, e)
    if cur_end is not None:
        total += cur_end - cur_start
    return total
