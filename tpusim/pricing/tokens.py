"""Token steps on the priced clock: when an inference program's prefill and each decode step ran on one chip.

Why one rule: the report's TTFT and TPOT (tpusim/report/inference.py) and ``tpusim validate``'s published
time-per-token cases (tpusim/validate/inference.py) read the same phases off the same timeline; two readings would
drift. A step's time runs from the end of the device work before it to the end of its own (op, collective and wait
events whose record falls in it), so host gaps between steps count, as a serving loop's wall clock counts them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tpusim.pricing.timeline import Timeline
from tpusim.trace.phases import Span, span_index

DEVICE_KINDS = ("op", "collective", "wait")
Window = tuple[float, float]


def span_windows(timeline: Timeline, spans: Sequence[Span], chip: int) -> list[Window | None]:
    """Per span: (first start, last end) of the device events on ``chip`` of the records in it (None: no event)."""
    index = span_index(spans)
    windows: list[Window | None] = [None] * len(spans)
    for e in timeline.events:
        if e.chip != chip or e.kind not in DEVICE_KINDS or (i := index(e.seq)) is None:
            continue
        old = windows[i]
        windows[i] = (e.start_s, e.end_s) if old is None else (min(old[0], e.start_s), max(old[1], e.end_s))
    return windows


@dataclass(frozen=True)
class TokenSteps:
    """The prefill's window (None: not marked or found), each decode step's seconds, and the decode's start/end."""

    prefill: Window | None
    steps_s: tuple[float, ...]
    start_s: float
    end_s: float

    @property
    def steady_s(self) -> tuple[float, ...]:
        """The decode steps after the first, which compiles what the loop runs (warm-up); all when only one ran."""
        return self.steps_s[1:] if len(self.steps_s) > 1 else self.steps_s

    @property
    def steady_start_s(self) -> float:
        """When the steady steps (``steady_s``) begin: after the first step, unless it is the only one."""
        return self.start_s + self.steps_s[0] if len(self.steps_s) > 1 else self.start_s


def token_steps(timeline: Timeline, prefill: Span | None, decode: Sequence[Span], chip: int) -> TokenSteps | None:
    """The token steps of ``chip`` (module docstring); None when no decode step ran device work there."""
    windows = [w for w in span_windows(timeline, decode, chip) if w is not None]
    if not windows:
        return None
    before = span_windows(timeline, [prefill], chip)[0] if prefill else None
    start = before[1] if before else windows[0][0]
    previous, steps = start, []
    for _, end in windows:
        steps.append(max(0.0, end - previous))
        previous = max(previous, end)
    return TokenSteps(before, tuple(steps), start, previous)
