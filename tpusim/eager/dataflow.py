"""Which write of which storage each input of a record stream reads: the values fusion reasons about.

Why its own module: forming clusters (``tpusim.eager.clusters``: which ops are dead, where an executable
ends), costing them (``tpusim.eager.cluster_cost``: what stays on chip) and placing the compiler's kernels
(``tpusim.eager.compiled``) all ask the same questions of one stream: who made a value, who reads it, when
it dies. ``Dataflow`` answers them once per stream.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tpusim.trace.records import CollectiveRecord, MemoryRecord, OpRecord, Record

CONSTANT = -2                    # producer of a value read from a storage allocated and never written (an empty tensor)


@dataclass
class Value:
    """One write of one storage (or what a storage held before the trace)."""

    producer: int                   # record position that wrote it; -1 = written before the trace;
    #                                 CONSTANT: an empty tensor's (TorchTPU re-emits it where it is read)
    nbytes: int
    readers: list[int] = field(default_factory=list)
    death: int | None = None        # position of its free or full overwrite; None = outlives the trace


class Dataflow:
    """The values of a record stream: each input's value (``reads``), each output's (``writes``)."""

    def __init__(self, records: Sequence[Record]) -> None:
        self.values: list[Value] = []
        self.reads: dict[tuple[int, int], int] = {}     # (position, input index) -> value
        self.writes: dict[tuple[int, int], int] = {}    # (position, output index) -> value
        current: dict[int, int] = {}                    # storage -> its latest value
        fresh: set[int] = set()                         # storages allocated in the trace and not written since
        for pos, rec in enumerate(records):
            if isinstance(rec, OpRecord | CollectiveRecord):
                for k, t in enumerate(rec.inputs):
                    v = current.get(t.storage)
                    if v is None:
                        v = current[t.storage] = self._new(CONSTANT if t.storage in fresh else -1, t.nbytes)
                    self.values[v].readers.append(pos)
                    self.reads[(pos, k)] = v
                for k, t in enumerate(rec.outputs):
                    old = current.get(t.storage)
                    if old is not None and self.values[old].death is None and t.nbytes >= self.values[old].nbytes:
                        self.values[old].death = pos            # wholly overwritten; partial writes keep it
                    self.writes[(pos, k)] = current[t.storage] = self._new(pos, t.nbytes)
                    fresh.discard(t.storage)
            elif isinstance(rec, MemoryRecord):
                (fresh.add if rec.event == "alloc" else fresh.discard)(rec.storage)
                old = current.pop(rec.storage, None)
                if old is not None and rec.event == "free" and self.values[old].death is None:
                    self.values[old].death = pos

    def _new(self, producer: int, nbytes: int) -> int:
        self.values.append(Value(producer, nbytes))
        return len(self.values) - 1

    def producers(self, pos: int, rec: OpRecord) -> set[int]:
        return {self.values[self.reads[(pos, k)]].producer for k in range(len(rec.inputs))}

    def leaves(self, v: int, kernel: set[int], end: int) -> bool:
        """True when the value must reach HBM: read outside ``kernel`` or alive at the window's end."""
        value = self.values[v]
        return value.death is None or value.death >= end or any(r not in kernel for r in value.readers)

    def outputs(self, pos: int, rec: Record) -> list[Value]:
        """The values record ``pos`` writes."""
        return [self.values[self.writes[(pos, k)]] for k in range(len(rec.outputs))]
