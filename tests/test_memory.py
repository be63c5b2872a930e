"""HBM live bytes and peak from alloc/free records, with hand-counted expectations."""

import dataclasses

from tpusim.hardware.memory import HbmTracker, hbm_timeline
from tpusim.hardware.spec import load_chip
from tpusim.trace.records import MemoryRecord, OpRecord


def chip(capacity):
    return dataclasses.replace(load_chip("v5p"), hbm_bytes=capacity)


def alloc(seq, storage, nbytes, rank=0):
    return MemoryRecord(seq=seq, event="alloc", storage=storage, bytes=nbytes, rank=rank)


def free(seq, storage, nbytes=0, rank=0):
    return MemoryRecord(seq=seq, event="free", storage=storage, bytes=nbytes, rank=rank)


def test_peak_from_alloc_and_free():
    records = [alloc(0, 1, 100), alloc(1, 2, 50),
               OpRecord(seq=2, op="aten::add", unit="vpu", dtype="float32"),
               free(3, 1), alloc(4, 3, 80), free(5, 2), free(6, 3)]
    # live: 100, 150 (peak at seq 1), 50, 130, 80, 0
    tl = hbm_timeline(records, chip(1000))
    assert [b for _, b in tl.points] == [100, 150, 50, 130, 80, 0]
    assert (tl.peak_bytes, tl.peak_at, tl.final_bytes) == (150, 1.0, 0)
    assert not tl.over_capacity and tl.peak_fraction == 0.15


def test_over_capacity_names_the_first_alloc_that_crossed():
    tl = hbm_timeline([alloc(0, 1, 600), alloc(1, 2, 600), free(2, 1), alloc(3, 4, 900)], chip(1000))
    # live: 600, 1200 (> 1000 at seq 1), 600, 1500
    assert tl.over_capacity and tl.first_over_seq == 1 and tl.peak_bytes == 1500


def test_free_uses_the_allocated_size_and_unknown_frees_are_counted():
    tl = hbm_timeline([alloc(0, 1, 64), free(1, 1, nbytes=999), free(2, 7, nbytes=32)], chip(1000))
    assert [b for _, b in tl.points] == [64, 0] and tl.unmatched_frees == 1


def test_per_rank_and_sim_time_stamps():
    records = [alloc(0, 1, 10, rank=0), alloc(1, 1, 20, rank=1)]
    assert hbm_timeline(records, chip(100), rank=1).peak_bytes == 20
    tracker = HbmTracker(100)
    tracker.apply(alloc(0, 1, 10), at=2.5e-6)
    assert tracker.result().points == ((2.5e-6, 10),)
