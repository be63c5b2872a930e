"""XLA's program prices a compiled program (tpusim/xla/kernels.py, fuse(..., compiled=)): the kernels XLA built
run in place of tpusim's own fusion of the program's ops, each priced by tpusim's compute and HBM model;
eager ops and other programs are untouched. The truth: kernel_cost applied by hand to the same kernels."""

import pytest
from factories import MB, N
from test_fusion import alloc, chain, ew, kernels, program, t, toy_chip
from test_xla_hlo import WORK

from tpusim.eager.fusion import CompiledProgram, CompilerOutput, fuse
from tpusim.eager.modes import get_mode
from tpusim.hardware.compute import kernel_cost
from tpusim.pricing import price
from tpusim.pricing.planning import plan
from tpusim.slice.topology import build_slice
from tpusim.trace.records import (
    CollectiveRecord,
    MemoryRecord,
    OpRecord,
    StepMarker,
    Trace,
    record_signature,
    renumber,
)
from tpusim.xla.hlo import Fusion, Step, XlaProgram, parse_program
from tpusim.xla.kernels import program_records

XLA = program_records(parse_program(WORK))


def traced():
    """eager neg, program 1 (mul, add, relu), eager abs, program 2 (the same graph again)."""
    return renumber([alloc(9), ew("neg", [1], 9, "m.py:7"), *program(chain(), 1), ew("abs", [4], 10, "m.py:8"),
                     *program(chain(), 2), StepMarker(0, 1)])


def test_xlas_kernels_replace_the_models_for_the_programs_the_compiler_built():
    records = traced()
    fused = fuse(records, toy_chip(), eager=False, compiled=CompilerOutput(programs={1: XLA}))
    ks = kernels(fused.records)
    assert [k.op for k in ks] == ["aten::neg", "xla:batched[kOutput]", "xla:projected[kOutput]",
                                  "xla:in_place[kLoop]", "aten::abs", "fused[mul+add+relu]"]
    assert [k.program for k in ks] == [0, 1, 1, 1, 0, 2]
    assert [k.unit for k in ks[1:4]] == ["mxu", "mxu", "vpu"]
    # what enters the program is read by its first kernel, what leaves it written by its last
    assert [t.storage for t in ks[1].inputs] == [1] and [t.storage for t in ks[3].outputs] == [4]
    assert ks[2].inputs == ks[2].outputs == ()
    # the program's memory records are all kept, in order (XLA's buffers are not tpusim's to drop)
    assert [(m.event, m.storage) for m in fused.records if isinstance(m, MemoryRecord)][:6] == \
        [("alloc", 9), ("alloc", 2), ("alloc", 3), ("free", 2), ("alloc", 4), ("free", 3)]


def test_the_engine_prices_xlas_kernels_with_the_chips_model():
    chip = toy_chip()
    slice_ = build_slice("3d:1x1x1", chip=chip)
    trace = Trace(traced())
    timeline = price(trace, topology=slice_, mode=get_mode("strict"),
                     compiled=CompilerOutput(programs={1: XLA, 2: XLA}))
    device = {e.name: e.end_s - e.start_s for e in timeline.events if e.kind == "op" and e.name.startswith("xla:")}
    for kernel in XLA.records:
        assert device[kernel.op] == pytest.approx(kernel_cost(kernel, chip).seconds, rel=1e-9)
    assert timeline.kernels == 2 + 2 * len(XLA.records)
    model = price(trace, topology=slice_, mode=get_mode("strict"))
    assert model.kernels == 4 and timeline.total_s != model.total_s


def test_a_program_xla_built_no_kernel_for_keeps_the_models():
    records = traced()
    nothing = CompilerOutput(programs={1: CompiledProgram(())})
    assert kernels(fuse(records, toy_chip(), eager=False, compiled=nothing).records) == \
        kernels(fuse(records, toy_chip(), eager=False).records)


# ---- a graph with collectives, compiled whole: XLA's schedule in place of its segments and c10d's collectives --
def whole_graph_trace():
    """One run of a graph with a collective: segment program 1, the all-gather c10d ran (program 1's run), and
    segment program 2; then a step."""
    gathered = t(7, 4 * N)
    collective = CollectiveRecord(0, "all_gather", 4 * MB, group=(0, 1, 2, 3), inputs=(t(5),), outputs=(gathered,),
                                  async_op=True, program=1)
    return renumber([*program([ew("mul", [1], 5)], 1), collective,
                     *program([ew("add", [7], 8)], 2), StepMarker(0, 1)])


def xla_schedule(overlapped: bool):
    """XLA's program for it: an all-gather started before a 10 MB kernel and done after it (overlapped), or
    synchronous before it; then the kernel that reads the gathered value."""
    def kernel(name, nbytes):
        return Step("kernel", Fusion(name, "kLoop", 0, 0, nbytes, read_bytes=nbytes, written_bytes=nbytes))

    gather = ([Step("start", opcode="all-gather", bytes=MB, dtype="f32", key="g")] if overlapped
              else [Step("collective", opcode="all-gather", bytes=MB, dtype="f32")])
    done = [Step("done", opcode="all-gather", key="g")] if overlapped else []
    return program_records(XlaProgram((), (), 0, (*gather, kernel("busy", 5 * 10**6), *done, kernel("reader", 10**6))),
                           spans=2)


def test_a_graph_compiled_whole_runs_xlas_collectives_over_the_recorded_group():
    fused = fuse(whole_graph_trace(), toy_chip(), eager=False,
                 compiled=CompilerOutput(programs={1: xla_schedule(True)}))
    out = [r for r in fused.records if isinstance(r, OpRecord | CollectiveRecord)]
    assert [getattr(r, "op", "") or r.collective for r in out] == ["all_gather", "xla:busy[kLoop]",
                                                                     "xla:reader[kLoop]"]
    gather, busy, reader = out
    assert gather.group == (0, 1, 2, 3) and gather.async_op and gather.bytes == MB and gather.program == 1
    assert [k.program for k in (busy, reader)] == [1, 1]
    assert {x.storage for x in gather.outputs} <= {x.storage for x in reader.inputs}   # the reader waits for it
    assert fused.stats.programs == 1 and fused.stats.program_ops == 2


def test_an_all_gather_xla_overlaps_is_priced_hidden():
    """The all-gather runs on ICI while the kernel XLA scheduled between its start and done runs: the device
    waits only for what is left of it; scheduled synchronously, all of it is exposed."""
    slice_ = build_slice("3d:2x2x1", chip=toy_chip())
    runs = {overlapped: price(Trace(whole_graph_trace(), world_size=4), topology=slice_, mode=get_mode("strict"),
                              compiled=CompilerOutput(programs={1: xla_schedule(overlapped)}))
            for overlapped in (True, False)}
    gather_s = runs[False].collective_exposed_s
    busy_s = next(e.end_s - e.start_s for e in runs[True].events if e.name == "xla:busy[kLoop]")
    assert gather_s > busy_s == pytest.approx(11e-6)                  # 10 MB at 1 TB/s, plus a 1 us launch
    assert runs[True].collective_exposed_s == pytest.approx(max(0.0, gather_s - busy_s), abs=1e-9)
    assert 0 < runs[True].collective_exposed_s < gather_s


# ---- eager ops XLA compiled one by one (Strict and Debug) ------------------------------------------------
def test_an_eager_op_runs_as_its_xla_kernels_dispatched_and_compiled_once_in_strict_not_in_fused():
    records = traced()
    neg = records[1]
    built = {record_signature(neg): XLA}
    strict = fuse(records, toy_chip(), eager=False, compiled=CompilerOutput(ops=built))
    ks = kernels(strict.records)
    assert [k.op for k in ks[:3]] == ["xla:batched[kOutput]", "xla:projected[kOutput]", "xla:in_place[kLoop]"]
    first, middle, last = ks[:3]
    assert first.inputs == neg.inputs and last.outputs == neg.outputs and middle.inputs == middle.outputs == ()
    assert first.parts == (neg,) and [k.follows for k in ks[:3]] == [False, True, True]
    chip = toy_chip(compile_s=1.0)
    planned = plan(Trace(records), get_mode("strict"), chip, CompilerOutput(ops=built))
    dispatch = dict(zip(planned.streams[0].records, planned.streams[0].dispatch_s))
    assert [dispatch[k] for k in ks[:3]] == [pytest.approx(0.5e-6), 0.0, 0.0]      # one op, one dispatch
    assert planned.meta["compile_cache"].misses == 1 + 1 + 1   # neg, abs, and the one program (run twice)
    fused = fuse(records, toy_chip(), compiled=CompilerOutput(ops=built))      # Fused: its clusters stay tpusim's
    assert not any(k.op.startswith("xla:") for k in kernels(fused.records))
