"""XLA's program prices a compiled program (tpusim/xla/kernels.py, fuse(..., compiled=)): the kernels XLA built
run in place of tpusim's own fusion of the program's ops, each priced by tpusim's compute and HBM model;
eager ops and other programs are untouched. The truth: kernel_cost applied by hand to the same kernels."""

import pytest
from test_fusion import alloc, chain, ew, kernels, program, toy_chip
from test_xla_hlo import WORK

from tpusim.eager.fusion import fuse
from tpusim.hardware.compute import kernel_cost
from tpusim.pricing import price
from tpusim.slice.topology import build_slice
from tpusim.trace.records import MemoryRecord, StepMarker, Trace, renumber
from tpusim.xla.hlo import parse_program
from tpusim.xla.kernels import program_kernels

XLA = program_kernels(parse_program(WORK))


def traced():
    """eager neg, program 1 (mul, add, relu), eager abs, program 2 (the same graph again)."""
    return renumber([alloc(9), ew("neg", [1], 9, "m.py:7"), *program(chain(), 1), ew("abs", [4], 10, "m.py:8"),
                     *program(chain(), 2), StepMarker(0, 1)])


def test_xlas_kernels_replace_the_models_for_the_programs_the_compiler_built():
    records = traced()
    fused = fuse(records, toy_chip(), eager=False, compiled={1: XLA})
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
    timeline = price(trace, topology=slice_, mode="strict", compiled={1: XLA, 2: XLA})
    device = {e.name: e.end_s - e.start_s for e in timeline.events if e.kind == "op" and e.name.startswith("xla:")}
    for kernel in XLA:
        assert device[kernel.op] == pytest.approx(kernel_cost(kernel, chip).seconds, rel=1e-9)
    assert timeline.kernels == 2 + 2 * len(XLA)
    model = price(trace, topology=slice_, mode="strict")
    assert model.kernels == 4 and timeline.total_s != model.total_s


def test_a_program_xla_built_no_kernel_for_keeps_the_models():
    records = traced()
    assert kernels(fuse(records, toy_chip(), eager=False, compiled={1: ()}).records) == \
        kernels(fuse(records, toy_chip(), eager=False).records)
