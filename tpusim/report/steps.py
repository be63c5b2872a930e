"""Warm-up and steady state: which of a run's steps still paid for compiles, and the median of the rest.

Why a rule of its own: a mode that compiles lazily (Fused eager, a compile cache per region) keeps
compiling in its second or third step, so "the median after the first step" can still be a median of
compile time (a fused run read 45x slower than strict that way). A warm-up step is one of the leading
steps in which the host compiled something (a compile-cache miss); the first step is always one when
there are two or more. The steady-state median is taken over the steps after the warm-up. When every
step compiled, the last step stands for the steady state and the report says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median

from tpusim.pricing.timeline import Timeline


@dataclass(frozen=True)
class Steps:
    """A mode's steps split into warm-up and steady state (report.json ``modes.<mode>.steps``)."""

    count: int                  # steps marked (optimizer.step() / tpusim.backend.step())
    warmup: int                 # leading steps counted as warm-up
    compiles: tuple[int, ...]   # compile-cache misses in each step
    reason: str                 # why the warm-up steps are warm-up, in words ("" when none)
    steady_median_s: float | None   # median of the steps after the warm-up; None without steps
    steady_start_s: float       # the steady-state window (the whole program without steps)
    steady_end_s: float

    @property
    def steady(self) -> int:
        return self.count - self.warmup


def split_steps(timeline: Timeline) -> Steps:
    """``timeline``'s steps split by the rule in the module docstring."""
    steps = timeline.steps
    if not steps:
        return Steps(0, 0, (), "", None, 0.0, timeline.total_s)
    # a compile belongs to the step its end falls in: the host runs ahead and starts compiling the next
    # step's kernel while the device still finishes this one
    # step. Counted on one chip (with --ranks all every simulated chip compiles the same regions)
    chip = timeline.chips_simulated[0] if timeline.chips_simulated else 0
    ends = [e.end_s for e in timeline.events if e.kind == "compile" and e.chip == chip]
    compiles = tuple(sum(1 for end in ends if step.start_s < end <= step.end_s) for step in steps)
    leading = next((i for i, n in enumerate(compiles) if n == 0), len(steps))
    warmup = min(max(leading, 1), len(steps) - 1) if len(steps) > 1 else 0
    if warmup == 0:
        reason = ""
    elif leading >= len(steps):
        reason = (f"every step compiled ({_misses(sum(compiles))}): the last step stands for the steady state")
    else:
        misses = sum(compiles[:warmup])
        reason = (_misses(misses) if misses else "the first step (caches and memory warm up)")
    steady = steps[warmup:]
    return Steps(len(steps), warmup, compiles, reason, median(s.seconds for s in steady),
                 steady[0].start_s, steady[-1].end_s)


def _misses(n: int) -> str:
    return f"{n} compile-cache miss" + ("" if n == 1 else "es")
