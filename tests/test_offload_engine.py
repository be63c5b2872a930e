"""Activation offload in the engine: host<->device copies on the chip's PCIe link, against timelines worked out by
hand (times in microseconds in the comments; the toy chip: 1 MB of HBM traffic = 1 us, launch 1 us, host dispatch
0.5 us, PCIe 1 GB/s so 1 kB = 1 us). A non_blocking copy runs beside compute; a blocking one stalls the host."""

import pytest
from factories import US, tensor, toy_chip

from tpusim.pricing import engine
from tpusim.pricing.plan import raw_plan
from tpusim.report.lint import syncs_in_step_loop
from tpusim.slice.topology import build_slice
from tpusim.trace.records import OFFLOAD_REASON, HostRecord, MemoryRecord, OpRecord, StepMarker, Trace, renumber


def simulate(*records):
    slice_ = build_slice("3d:1x1x1", chip=toy_chip())
    return engine.simulate(raw_plan(Trace(records=renumber(records)), slice_.chip), slice_)


def op(reads=(), writes=()):
    """2 us on the toy chip (1 MB of HBM traffic + 1 us launch)."""
    return OpRecord(seq=0, op="aten::add", unit="vpu", dtype="float32", bytes_read=5e5, bytes_written=5e5,
                    inputs=tuple(tensor(s, n=1) for s in reads), outputs=tuple(tensor(s, n=1) for s in writes))


def d2h(storage, host, nbytes=3000, non_blocking=True):
    return HostRecord(seq=0, event="d2h", reason=OFFLOAD_REASON, bytes=nbytes, storage=storage, host=host,
                      non_blocking=non_blocking)


def h2d(storage, host, nbytes=3000, non_blocking=True):
    return HostRecord(seq=0, event="h2d", reason="to_device", bytes=nbytes, storage=storage, host=host,
                      non_blocking=non_blocking)


def spans(events):
    return [x / US for e in events for x in (e.start_s, e.end_s)]


def test_a_non_blocking_offload_runs_beside_compute():
    tl = simulate(op(writes=(5,)), d2h(5, 1), op(), op(), op(), StepMarker(seq=0, step=0))
    # host: op 0.5, the copy queued at 0.5 (no stall), ops 1.0, 1.5, 2.0. Device: 0.5-2.5, the copy reaches the
    # queue at 2.5 and runs on PCIe 2.5-5.5 (3 kB) while the ops run 2.5-4.5, 4.5-6.5, 6.5-8.5; the step ends at 8.5.
    assert spans(tl.events_on("pcie")) == pytest.approx([2.5, 5.5])
    assert tl.host_stall_s == 0 and tl.host_transfer_s == 0
    assert [s.end_s / US for s in tl.steps] == pytest.approx([8.5])


def test_the_same_copy_blocking_stalls_the_host_and_costs_more():
    tl = simulate(op(writes=(5,)), d2h(5, 1, non_blocking=False), op(), op(), op(), StepMarker(seq=0, step=0))
    # host: op 0.5; the copy waits for the device (0.5-2.5), then copies 2.5-5.5 on the host's clock; ops are
    # issued at 6.0, 6.5, 7.0 and run 6.0-8.0, 8.0-10.0, 10.0-12.0: 12 us against 8.5 us overlapped.
    assert spans(tl.events_on("pcie")) == pytest.approx([2.5, 5.5])
    assert tl.host_transfer_s == pytest.approx(3 * US) and tl.host_stall_s == pytest.approx(2 * US)
    assert [s.end_s / US for s in tl.steps] == pytest.approx([12.0])


def test_an_op_reading_a_reloaded_buffer_waits_for_its_copy():
    tl = simulate(op(), h2d(9, 0), op(reads=(9,)))
    # op 0.5-2.5; the h2d reaches the queue at 2.5: PCIe 2.5-5.5; the reader (issued 1.0) waits 2.5-5.5, runs 5.5-7.5.
    waits = [e for e in tl.events if e.kind == "wait"]
    assert [(w.bound, w.seconds / US) for w in waits] == [("pcie", pytest.approx(3.0))]
    assert tl.total_s == pytest.approx(7.5 * US)


def test_a_reload_waits_for_the_offload_that_filled_its_host_buffer():
    tl = simulate(op(writes=(5,)), d2h(5, 1), h2d(9, 1), op(reads=(9,)))
    # d2h 2.5-5.5 on its channel; the h2d of host buffer 1 starts when it is filled: 5.5-8.5; the reader waits
    # until 8.5 and runs 8.5-10.5. The two directions are separate channels, but the data is not there before.
    assert spans(tl.events_on("pcie")) == pytest.approx([2.5, 5.5, 5.5, 8.5])
    assert tl.total_s == pytest.approx(10.5 * US)


def test_copies_in_one_direction_share_the_channel():
    tl = simulate(op(writes=(5,)), op(writes=(6,)), d2h(5, 1), d2h(6, 2))
    # ops 0.5-2.5, 2.5-4.5; both copies reach the queue at 4.5: one PCIe channel device->host, 4.5-7.5, 7.5-10.5.
    assert spans(tl.events_on("pcie")) == pytest.approx([4.5, 7.5, 7.5, 10.5])


def test_an_offloaded_buffer_leaves_hbm_once_its_copy_is_done():
    tl = simulate(MemoryRecord(seq=0, event="alloc", storage=5, bytes=1000), op(writes=(5,)), d2h(5, 1),
                  MemoryRecord(seq=0, event="free", storage=5, bytes=1000), op(), op())
    # the host frees storage 5 at 1.0 (after queuing the copy), but the copy reads it 2.5-5.5: HBM holds it until 5.5.
    points = tl.memory[0].points
    assert [(t / US, b) for t, b in points] == [(pytest.approx(0.0), 1000), (pytest.approx(5.5), 0)]
    blocking = simulate(MemoryRecord(seq=0, event="alloc", storage=5, bytes=1000), op(writes=(5,)),
                        d2h(5, 1, non_blocking=False), MemoryRecord(seq=0, event="free", storage=5, bytes=1000))
    # a blocking copy is done before the host goes on (0.5-2.5 stall, 2.5-5.5 copy): freed at host time 5.5
    assert [(t / US, b) for t, b in blocking.memory[0].points] == [(pytest.approx(0.0), 1000), (pytest.approx(5.5), 0)]


def test_synchronize_waits_for_copies_in_flight():
    tl = simulate(op(writes=(5,)), d2h(5, 1, nbytes=10_000), HostRecord(seq=0, event="sync", reason="synchronize"),
                  op())
    # op 0.5-2.5; copy 2.5-12.5 (10 kB); torch.tpu.synchronize() waits for it: the next op is issued at 13.0.
    last = tl.events_on("tensorcore")[-1]
    assert (last.kind, last.start_s / US) == ("op", pytest.approx(13.0))
    assert [(w.bound, w.seconds / US) for w in tl.events if w.kind == "wait"] == [("pcie", pytest.approx(10.0))]


def test_offloads_in_the_step_loop_are_no_host_sync_warning():
    """An offload's copies are priced in the offload rows (PCIe exposed), not flagged as a value read each step."""
    step = [op(writes=(5,)), d2h(5, 1), HostRecord(seq=0, event="sync", reason="cpu", source="m.py:7"),
            HostRecord(seq=0, event="d2h", reason="cpu", bytes=4, source="m.py:7")]
    records = renumber([*step, StepMarker(seq=0, step=1), *step, StepMarker(seq=0, step=2)])
    found = syncs_in_step_loop(Trace(records=records), toy_chip(), None)
    assert [(message.split("`")[1], source) for message, source in found] == [("cpu", "m.py:7")]
