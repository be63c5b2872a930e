"""HBM capacity per chip: live bytes over time, the peak, and whether it fits.

The trace's ``MemoryRecord``s say when device storage is allocated and freed. Replaying
them gives the live-bytes curve of one chip; its peak against ``chip.hbm_bytes`` is
the "would this OOM on a real TPU" answer. ``HbmTracker`` is fed during a simulation
(stamped with simulated time); ``hbm_timeline`` replays records on their own
(stamped with ``seq``) for a quick look without the engine.

A free of a storage the trace never allocated (allocated before recording began) is
counted in ``unmatched_frees`` and otherwise ignored; a storage allocated twice
without a free in between counts both sizes (the backend never reuses a live id).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tpusim.hardware.spec import ChipSpec
from tpusim.trace.records import MemoryRecord, Record


@dataclass(frozen=True)
class MemoryTimeline:
    """Live HBM bytes of one chip: a step curve of (time, live bytes) points, one per event."""

    points: tuple[tuple[float, int], ...]   # (seconds, or seq when replayed without the engine; bytes)
    peak_bytes: int
    peak_at: float                          # time (or seq) the peak was first reached
    capacity_bytes: int
    final_bytes: int                        # still live at the end (parameters, leaks)
    unmatched_frees: int = 0
    first_over_seq: int | None = None       # seq of the alloc that first crossed capacity

    @property
    def over_capacity(self) -> bool:
        return self.peak_bytes > self.capacity_bytes

    @property
    def peak_fraction(self) -> float:
        return self.peak_bytes / self.capacity_bytes if self.capacity_bytes else 0.0


class HbmTracker:
    """Mutable live-bytes counter for one chip, fed alloc/free records in order."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.live = 0
        self._sizes: dict[int, list[int]] = {}
        self._points: list[tuple[float, int]] = []
        self._peak = 0
        self._peak_at = 0.0
        self._unmatched = 0
        self._first_over: int | None = None

    def apply(self, record: MemoryRecord, at: float) -> None:
        if record.event == "alloc":
            self._sizes.setdefault(record.storage, []).append(record.bytes)
            self.live += record.bytes
        else:
            sizes = self._sizes.get(record.storage)
            if not sizes:
                self._unmatched += 1
                return
            self.live -= sizes.pop()
            if not sizes:
                del self._sizes[record.storage]
        self._points.append((at, self.live))
        if self.live > self._peak:
            self._peak, self._peak_at = self.live, at
        if self.live > self.capacity_bytes and self._first_over is None:
            self._first_over = record.seq

    def result(self) -> MemoryTimeline:
        return MemoryTimeline(points=tuple(self._points), peak_bytes=self._peak, peak_at=self._peak_at,
                              capacity_bytes=self.capacity_bytes, final_bytes=self.live,
                              unmatched_frees=self._unmatched, first_over_seq=self._first_over)


def hbm_timeline(records: Iterable[Record], chip: ChipSpec, rank: int | None = None) -> MemoryTimeline:
    """Replay the memory records (of one rank, if given) against the chip's HBM, stamped by seq."""
    tracker = HbmTracker(chip.hbm_bytes)
    for record in records:
        if isinstance(record, MemoryRecord) and (rank is None or record.rank == rank):
            tracker.apply(record, float(record.seq))
    return tracker.result()
