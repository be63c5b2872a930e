"""The engine against timelines worked out by hand (times in microseconds in the comments)."""

import dataclasses

import pytest
from factories import US, tensor, toy_chip

from tpusim.errors import TpusimError
from tpusim.network.collectives import closed_form_time
from tpusim.pricing import engine
from tpusim.pricing.plan import raw_plan
from tpusim.slice.topology import build_slice
from tpusim.trace.records import (
    CollectiveRecord,
    HostRecord,
    MemoryRecord,
    OpRecord,
    StepMarker,
    Trace,
    renumber,
)


def simulate(trace, slice_, **queue):
    """The engine alone: the trace as recorded (no mode's compile cache, checks or fusion)."""
    return engine.simulate(raw_plan(trace, slice_.chip, **queue), slice_)

def one_chip(**overrides):
    return build_slice("3d:1x1x1", chip=toy_chip(**overrides))


def t(storage):
    return tensor(storage, n=1)


def op(mb=1.0, name="aten::add", unit="vpu", reads=(), writes=()):
    """A memory-bound op moving ``mb`` MB: mb us of HBM + 1 us launch on the toy chip."""
    return OpRecord(seq=0, op=name, unit=unit, dtype="float32", bytes_read=mb * 1e6 / 2,
                    bytes_written=mb * 1e6 / 2, inputs=tuple(map(t, reads)), outputs=tuple(map(t, writes)))


def spans(events):
    """[(start, end), ...] in microseconds, flattened for pytest.approx."""
    return [x / US for e in events for x in (e.start_s, e.end_s)]


def trace(*records, world_size=1):
    return Trace(records=renumber(records), world_size=world_size)


def test_sequential_ops_sum_when_the_device_is_the_bottleneck():
    tl = simulate(trace(op(), op(), op()), one_chip())
    # host issues at 0.5, 1.0, 1.5; device runs 0.5-2.5, 2.5-4.5, 4.5-6.5 (each 1 us HBM + 1 us launch).
    ops = tl.events_on("tensorcore")
    assert spans(ops) == pytest.approx([0.5, 2.5, 2.5, 4.5, 4.5, 6.5])
    assert tl.total_s == pytest.approx(6.5 * US)
    assert tl.busy_s["tensorcore"] == pytest.approx(6 * US)
    assert tl.host_dispatch_s == pytest.approx(1.5 * US) and tl.host_stall_s == 0
    assert tl.kernels == 3 and tl.time_by_bound == {"hbm": pytest.approx(6 * US)}


def test_host_bound_program_leaves_the_device_idle():
    tl = simulate(trace(op(), op(), op()), one_chip(host_dispatch_ns=10_000.0))
    # dispatch 10 us each: ops run 10-12, 20-22, 30-32.
    assert tl.total_s == pytest.approx(32 * US)
    assert tl.busy_s["tensorcore"] == pytest.approx(6 * US)


def test_sync_stalls_the_host_until_the_device_drains():
    tl = simulate(trace(op(), op(), op(), HostRecord(seq=0, event="sync", reason="item", source="m.py:9"),
                        op()), one_chip())
    # host reaches the sync at 1.5, the device drains at 6.5: 5 us stall; the last op is issued at 7.0
    # and runs 7.0-9.0.
    assert tl.host_stall_s == pytest.approx(5 * US)
    stall = [e for e in tl.events_on("host") if e.kind == "stall"]
    assert len(stall) == 1 and stall[0].bound == "item" and stall[0].source == "m.py:9"
    assert tl.total_s == pytest.approx(9 * US)


def test_h2d_syncs_then_copies_over_pcie():
    tl = simulate(trace(op(), HostRecord(seq=0, event="h2d", bytes=3000), op()), one_chip())
    # op 0.5-2.5; h2d: stall 0.5-2.5, then 3 kB / 1 GB/s = 3 us (2.5-5.5); next op issued 6.0, runs 6.0-8.0.
    assert tl.host_stall_s == pytest.approx(2 * US)
    assert tl.host_transfer_s == pytest.approx(3 * US)
    assert tl.busy_s["pcie"] == pytest.approx(3 * US)
    assert tl.total_s == pytest.approx(8 * US)


def test_debug_policy_waits_after_every_op():
    tl = simulate(trace(op(), op(), op()), one_chip(), queue_depth=1, sync_each_op=True, name="debug")
    # each op: 0.5 dispatch + 2 run, nothing overlaps: 3 x 2.5 = 7.5 us.
    assert tl.total_s == pytest.approx(7.5 * US)
    assert tl.host_stall_s == pytest.approx(6 * US) and tl.policy == "debug"


def test_full_queue_stalls_the_host():
    tl = simulate(trace(op(), op(), op(), op()), one_chip(), queue_depth=1)
    # device takes op1 at 0.5 (queue empty again), op2 waits in the queue from 1.0; op3 can only be
    # put when the device takes op2 at 2.5: the host stalls 1.5-2.5, then 4.5-... the total is set by
    # the device: 0.5 + 4 x 2 = 8.5 us.
    assert tl.total_s == pytest.approx(8.5 * US)
    stalls = [e for e in tl.events_on("host") if e.kind == "stall"]
    assert stalls and all(e.bound == "queue_full" for e in stalls)


def test_step_times_from_markers():
    tl = simulate(trace(op(), op(), StepMarker(seq=0, step=0), op(), StepMarker(seq=0, step=1), op()),
                  one_chip())
    # device: 0.5-2.5, 2.5-4.5 | step 0 ends at 4.5; 4.5-6.5 | step 1 ends at 6.5; tail 6.5-8.5.
    assert [s.step for s in tl.steps] == [0, 1]
    assert spans(tl.steps) == pytest.approx([0.0, 4.5, 4.5, 6.5])
    assert [s.seconds / US for s in tl.steps] == pytest.approx([4.5, 2.0])
    assert tl.total_s == pytest.approx(8.5 * US)


def test_sparsecore_runs_beside_the_tensorcore_until_its_output_is_read():
    lookup = op(mb=10, name="aten::embedding", unit="sparsecore", writes=(7,))
    tl = simulate(trace(lookup, op(), op(), op(reads=(7,))), one_chip())
    # SparseCore 0.5-11.5 (10 MB at 1 TB/s + 1 us). TensorCore: 1.0-3.0, 3.0-5.0; the reader of
    # storage 7 waits 5.0-11.5, then runs 11.5-13.5.
    assert spans(tl.events_on("sparsecore")) == pytest.approx([0.5, 11.5])
    reader = tl.events_on("tensorcore")[-1]
    assert (reader.kind, reader.start_s / US, reader.end_s / US) == ("op", pytest.approx(11.5),
                                                                     pytest.approx(13.5))
    waits = [e for e in tl.events if e.kind == "wait"]
    assert len(waits) == 1 and waits[0].bound == "sparsecore" and waits[0].seconds == pytest.approx(6.5 * US)
    # Without SparseCores the lookup runs on the TensorCore, in order: 0.5-11.5, then 3 x 2 us.
    v5e_like = simulate(trace(lookup, op(), op(), op(reads=(7,))), one_chip(sparsecores_per_chip=0))
    assert v5e_like.total_s == pytest.approx(17.5 * US) and "sparsecore" not in v5e_like.busy_s


def test_memory_records_give_the_hbm_peak_at_host_time():
    records = (MemoryRecord(seq=0, event="alloc", storage=1, bytes=400), op(),
               MemoryRecord(seq=0, event="alloc", storage=2, bytes=700), op(),
               MemoryRecord(seq=0, event="free", storage=1, bytes=400))
    tl = simulate(trace(*records), one_chip(hbm_bytes=1000))
    # live: 400 at 0, 1100 at 0.5 us (after the first dispatch), 700 at 1.0 us.
    mem = tl.memory[0]
    assert [b for _, b in mem.points] == [400, 1100, 700]
    assert [at / US for at, _ in mem.points] == pytest.approx([0.0, 0.5, 1.0])
    assert tl.peak_hbm_bytes == 1100 and mem.over_capacity


def test_world_larger_than_slice_is_an_error():
    with pytest.raises(TpusimError, match="world size 8"):
        simulate(trace(op(), world_size=8), one_chip())


# ---- collectives ------------------------------------------------------------------------------
V = 64 * 2**20          # a 64 MiB gradient buffer


def all_reduce(async_op=False, storage=10, nbytes=V, **kw):
    return CollectiveRecord(seq=0, collective="all_reduce", bytes=nbytes, async_op=async_op,
                            inputs=(t(storage),), outputs=(t(storage),), **kw)


def torus_4x4x4():
    return build_slice("3d:4x4x4", chip=toy_chip())


def test_sync_collective_blocks_the_device_queue():
    sl = torus_4x4x4()
    ar = closed_form_time(sl, "all_reduce", V)   # ~262 us: 2V / (3 axes x 2 x 90 GB/s) + latency
    tl = simulate(trace(op(), all_reduce(), op(mb=1000), op(reads=(10,)), world_size=64), sl)
    # op 0.5-2.5; all-reduce 2.5 - 2.5+ar (the queue waits); the 1000 MB op (1001 us), then 2 us.
    (run,) = tl.collectives
    assert run.start_s == pytest.approx(2.5 * US) and run.result.group_size == 64
    assert run.end_s - run.start_s == pytest.approx(ar, rel=0.01)
    assert tl.total_s == pytest.approx(2.5 * US + ar + 1001 * US + 2 * US, rel=1e-3)
    assert tl.collective_exposed_s == pytest.approx(run.end_s - run.start_s)
    assert tl.symmetric and tl.chips_simulated == (0,)


def test_async_collective_overlaps_compute_until_its_output_is_read():
    sl = torus_4x4x4()
    tl = simulate(trace(op(), all_reduce(async_op=True), op(mb=1000), op(reads=(10,)), world_size=64), sl)
    # The device runs op 1 until 2.5 us, then starts the all-reduce (~262 us) and at once the
    # 1000 MB op (2.5-1003.5), which hides it; the reader runs 1003.5-1005.5 without waiting.
    assert tl.total_s == pytest.approx(1005.5 * US)
    assert tl.collective_exposed_s == 0.0
    assert tl.busy_s["ici"] == pytest.approx(closed_form_time(sl, "all_reduce", V), rel=0.01)
    # A short op after it must wait: the reader starts when the all-reduce ends.
    short = simulate(trace(op(), all_reduce(async_op=True), op(), op(reads=(10,)), world_size=64), sl)
    (run,) = short.collectives
    reader = short.events_on("tensorcore")[-1]
    assert reader.start_s == pytest.approx(run.end_s) and short.collective_exposed_s > 0


def test_overlapping_collectives_contend_for_links():
    sl = torus_4x4x4()
    alone = simulate(trace(all_reduce(async_op=True), world_size=64), sl).collectives[0]
    both = simulate(trace(all_reduce(async_op=True, storage=10), all_reduce(async_op=True, storage=11),
                          world_size=64), sl).collectives
    # Both all-reduces use every link of the torus: together they take about twice as long.
    alone_s = alone.end_s - alone.start_s
    assert max(r.end_s for r in both) - min(r.start_s for r in both) == pytest.approx(2 * alone_s, rel=0.1)


def test_all_gather_is_priced_on_its_output_and_groups_map_to_axes():
    sl = torus_4x4x4()
    x_line = (0, 1, 2, 3)                        # ranks varying in x only
    rec = CollectiveRecord(seq=0, collective="all_gather", bytes=V, group=x_line)
    (run,) = simulate(trace(rec, world_size=64), sl).collectives
    # Input V per rank -> output 4V; on one wrapped axis of 4: ~ 4V / (2 x 90 GB/s).
    assert run.result.bytes == 4 * V and run.result.axes == ("x",) and run.group_size == 4
    assert run.end_s - run.start_s == pytest.approx(closed_form_time(sl, "all_gather", 4 * V, axes="x"),
                                                    rel=0.01)


def test_512_chip_slice_simulates_one_chip_and_the_whole_torus():
    sl = build_slice("3d:8x8x8", chip=toy_chip())
    records = []
    for i in range(200):
        records.append(op())
        if i % 50 == 0:
            records.append(all_reduce(async_op=True, storage=100 + i, nbytes=2**30))
    tl = simulate(trace(*records, world_size=512), sl)
    assert tl.chips_simulated == (0,) and tl.symmetric
    assert all(r.result.group_size == 512 for r in tl.collectives) and len(tl.collectives) == 4
    assert tl.link_stats is not None and tl.link_stats.channels


# ---- several ranks (MPMD) ---------------------------------------------------------------------
def ranked(rank, *records):
    return [dataclasses.replace(r, rank=rank) for r in records]


def test_mpmd_collective_starts_when_the_last_rank_arrives():
    sl = build_slice("3d:2x1x1", chip=toy_chip())
    records = (ranked(0, op(mb=100), all_reduce(nbytes=2**20), op())
               + ranked(1, all_reduce(nbytes=2**20), op()))
    tl = simulate(trace(*records, world_size=2), sl)
    # rank 0 reaches the all-reduce at 0.5 + 101 = 101.5 us; rank 1 (there at 0.5 us) waits for it.
    assert tl.chips_simulated == (0, 1) and not tl.symmetric
    starts = {r.chip: r.start_s for r in tl.collectives}
    assert starts[0] == starts[1] == pytest.approx(101.5 * US)
    wait1 = [e for e in tl.events_on("tensorcore", chip=1) if e.kind == "wait"]
    assert wait1[0].start_s == pytest.approx(0.5 * US) and wait1[0].bound == "collective"


def test_mpmd_mismatch_and_hang_are_reported():
    sl = build_slice("3d:2x1x1", chip=toy_chip())
    bad = ranked(0, all_reduce(source="a.py:1")) + ranked(1, dataclasses.replace(
        all_reduce(source="a.py:2"), collective="all_gather"))
    with pytest.raises(TpusimError, match="mismatched collectives.*a.py:1.*a.py:2"):
        simulate(trace(*bad, world_size=2), sl)
    hang = ranked(0, all_reduce(source="a.py:1"), op()) + ranked(1, op())
    with pytest.raises(TpusimError, match=r"rank\(s\) \[1\] never reached it"):
        simulate(trace(*hang, world_size=2), sl)


def test_barrier_is_a_one_element_all_reduce():
    sl = torus_4x4x4()
    (run,) = simulate(trace(CollectiveRecord(seq=0, collective="barrier", bytes=0), world_size=64), sl).collectives
    # 4 bytes: latency-bound (hops x 1 us + the collective's fixed overhead), not zero.
    assert run.kind == "barrier" and run.result.kind == "all_reduce" and run.result.bytes == 4
    assert run.end_s - run.start_s == pytest.approx(closed_form_time(sl, "all_reduce", 4), rel=0.01)


def test_hidden_collective_time_is_what_ran_under_compute():
    sl = torus_4x4x4()
    long = simulate(trace(op(), all_reduce(async_op=True), op(mb=1000), op(reads=(10,)), world_size=64), sl)
    assert long.collective_hidden_s == pytest.approx(long.collective_s) and long.collective_exposed_s == 0.0
    # The short op (2 us, as the reader above) hides that much of the all-reduce; its reader waits out the rest.
    short = simulate(trace(op(), all_reduce(async_op=True), op(), op(reads=(10,)), world_size=64), sl)
    assert short.collective_hidden_s == pytest.approx(2 * US, rel=1e-3)
    assert short.collective_hidden_s + short.collective_exposed_s == pytest.approx(short.collective_s)
