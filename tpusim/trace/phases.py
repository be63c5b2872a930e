"""Inference phases a script marked (``tpusim.backend.phase``): the record ranges of its prefill and decode steps.

Why here, below the report and the validation suite: both read the same marks (the report to speak of TTFT and
TPOT, ``tpusim validate`` to price a published decode step through the product path), so one reading serves both.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence

from tpusim.trace.records import PHASE_REASON, HostRecord, Record

Span = tuple[int, int]      # [first seq, end seq) of a phase
END = "end"


def marked_spans(records: Sequence[Record]) -> tuple[Span | None, tuple[Span, ...]]:
    """(the prefill, from its first mark to the end of its last; the decode steps, one span per mark) of one rank's
    records, from the zero-second ``dispatch`` records ``phase:<name>`` / ``phase:end`` the marker writes."""
    if not records:
        return None, ()
    spans: list[tuple[str, int, int]] = []
    open_: tuple[str, int] | None = None
    for rec in records:
        if isinstance(rec, HostRecord) and rec.event == "dispatch" and rec.reason.startswith(PHASE_REASON):
            if open_ is not None:
                spans.append((*open_, rec.seq))
            name = rec.reason[len(PHASE_REASON):]
            open_ = (name, rec.seq) if name != END else None
    if open_ is not None:
        spans.append((*open_, records[-1].seq + 1))
    prefills = [(a, b) for name, a, b in spans if name == "prefill"]
    prefill = (prefills[0][0], prefills[-1][1]) if prefills else None
    return prefill, tuple((a, b) for name, a, b in spans if name == "decode")


def span_index(spans: Sequence[Span]) -> Callable[[int], int | None]:
    """seq -> the index of the span that holds it (spans in order, not overlapping), else None."""
    starts = [a for a, _ in spans]

    def index(seq: int) -> int | None:
        i = bisect_right(starts, seq) - 1
        return i if i >= 0 and seq < spans[i][1] else None
    return index
