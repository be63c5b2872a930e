"""Warm-up steps apart from the steady state, and the headline numbers (tokens/s, TFLOP/s, MFU at the dtypes'
peak, exposed communication, the bound verdict), checked against closed forms and the priced timeline."""

import dataclasses
from statistics import median

import pytest
from factories import A, B, C, training_trace

from tpusim.eager.modes import get_mode
from tpusim.pricing import price
from tpusim.report import RunInfo, build_report, summary_table
from tpusim.report.headline import peak_of_dtypes
from tpusim.report.lint import lint
from tpusim.report.steps import split_steps
from tpusim.slice.topology import build_slice
from tpusim.trace.records import CollectiveRecord, OpRecord, StepMarker, TensorMeta, Trace, renumber


def mm(source: str, rows: int = 64, dtype: str = "bfloat16") -> OpRecord:
    a = TensorMeta(1, (rows, 128), dtype, rows * 256, 1)
    return OpRecord(0, "aten::mm", "mxu", dtype, (a, B), (C,), flops=2 * rows * 128 * 64,
                    bytes_read=a.nbytes + B.nbytes, bytes_written=C.nbytes, matmul=(1, rows, 128, 64), source=source)


def late_compile_trace(steps: int = 5) -> Trace:
    """Step 0 runs one matmul; from step 1 on a second matmul of a new shape joins: step 1 compiles too (the
    way Fused eager's second step still compiles the optimizer's first window)."""
    records = []
    for step in range(steps):
        records.append(mm("train.py:3"))
        if step:
            records.append(mm("train.py:4", rows=32))
        records.append(StepMarker(0, step))
    return Trace(renumber(records))


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_steps_that_compile_are_warm_up_and_the_median_leaves_them_out(mode):
    slice_ = build_slice("3d:1x1x1", "v5p")
    timeline = price(late_compile_trace(), topology=slice_, mode=get_mode(mode))
    steps = split_steps(timeline)
    assert steps.count == 5 and steps.warmup == 2 and steps.compiles[2:] == (0, 0, 0)
    assert steps.compiles[0] >= 1 and steps.compiles[1] >= 1 and "compile-cache miss" in steps.reason
    seconds = [s.seconds for s in timeline.steps]
    assert steps.steady_median_s == median(seconds[2:])
    # the old rule (median after the first step) kept step 1's compile in the median
    assert seconds[1] > steps.steady_median_s + 0.9 * slice_.chip.compile_s
    report = build_report(RunInfo("train.py"), late_compile_trace(), slice_, {mode: timeline})
    assert report.modes[mode].step_time_median_s == pytest.approx(steps.steady_median_s)
    assert report.modes[mode].steps.warmup == 2
    assert f"warm-up ({mode}): 2 of 5 steps left out of the median" in summary_table(report, "out")


def test_a_run_without_steps_says_so_instead_of_a_step_time():
    trace = Trace(renumber([mm("x.py:1"), mm("x.py:2")]))
    slice_ = build_slice("3d:1x1x1", "v5p")
    timeline = price(trace, topology=slice_, mode=get_mode("strict"))
    assert split_steps(timeline).count == 0
    report = build_report(RunInfo("x.py"), trace, slice_, {"strict": timeline})
    table = summary_table(report, "out")
    row = next(line for line in table.splitlines() if line.startswith("step time"))
    assert row.split()[-2:] == ["no", "steps"] and "no steps marked" in table.splitlines()[0]
    assert report.modes["strict"].headline.step_s is None
    assert "1 chip)" in table.splitlines()[0]          # not "1 chips"
    assert report.modes["strict"].headline.verdict.startswith("no steps marked, so over the whole program: ")


def test_a_program_where_nothing_ran_on_the_device_is_bound_by_nothing():
    slice_ = build_slice("3d:1x1x1", "v5p")
    trace = Trace(renumber([StepMarker(0, 0)]))
    timeline = price(trace, topology=slice_, mode=get_mode("strict"))
    report = build_report(RunInfo("x.py"), trace, slice_, {"strict": timeline})
    head = report.modes["strict"].headline
    assert head.bound is None and head.levers == []
    assert head.verdict == "nothing ran on the device (no kernels): no bound to report"
    row = next(line for line in summary_table(report, "out").splitlines() if line.startswith("bound by"))
    assert row.split()[-1] == "-"


def test_every_step_compiling_keeps_the_last_as_steady_state():
    records = []
    for step, rows in enumerate((16, 32, 48)):       # a new shape each step: each compiles
        records += [mm("t.py:1", rows=rows), StepMarker(0, step)]
    timeline = price(Trace(renumber(records)), topology=build_slice("3d:1x1x1", "v5p"), mode=get_mode("strict"))
    steps = split_steps(timeline)
    assert (steps.warmup, steps.steady) == (2, 1) and "last step stands for the steady state" in steps.reason
    assert steps.steady_median_s == timeline.steps[-1].seconds


def test_headline_numbers_follow_from_the_steady_step():
    trace = training_trace(4)
    slice_ = build_slice("3d:1x1x1", "v5p")
    timelines = {"strict": price(trace, topology=slice_, mode=get_mode("strict"))}
    report = build_report(RunInfo("model.py", tokens_per_step=4096), trace, slice_, timelines,
                          lint(trace, slice_.chip, timelines["strict"]))
    head = report.modes["strict"].headline
    step = head.step_s
    flops = 2 * 64 * 128 * 64 + 8 * 64 * 64                 # one step of training_trace: mm + gelu
    assert head.flops_per_step_per_chip == pytest.approx(flops)
    assert head.tflops_per_s_per_chip == pytest.approx(flops / step / 1e12, rel=1e-6)
    assert head.hfu == pytest.approx(flops / step / slice_.chip.peak_bf16_flops_per_s, rel=1e-6)
    assert head.tokens_per_s_per_slice == pytest.approx(4096 / step, rel=1e-6)
    assert head.tokens_per_s_per_chip == head.tokens_per_s_per_slice        # one chip
    # a few tiny ops: the device waits for the host; the sync in the loop is the lever
    assert head.bound == "host dispatch" and head.levers == ["host-sync"]
    assert head.verdict.startswith("host dispatch-bound") and "host-sync" in head.verdict
    table = summary_table(report, "out")
    assert "tokens/s per chip" in table and "verdict (strict): host dispatch-bound" in table


def test_model_flops_utilisation_is_six_parameters_tokens_over_the_step_and_hfu_stays_what_ran():
    trace = training_trace(4)
    trace = dataclasses.replace(trace, meta=trace.meta.replace(trained_parameters=10_000))
    slice_ = build_slice("3d:1x1x1", "v5p")
    timelines = {"strict": price(trace, topology=slice_, mode=get_mode("strict"))}
    report = build_report(RunInfo("model.py", tokens_per_step=4096), trace, slice_, timelines, [])
    head = report.modes["strict"].headline
    assert head.model_flops_per_step_per_chip == 6 * 10_000 * 4096
    assert head.model_flops_utilisation == pytest.approx(
        6 * 10_000 * 4096 / head.step_s / slice_.chip.peak_bf16_flops_per_s, rel=1e-6)
    assert head.hfu == pytest.approx(head.flops_per_step_per_chip / head.step_s / slice_.chip.peak_bf16_flops_per_s)
    assert "MFU (6 x params x tokens)" in summary_table(report, "out")
    without = build_report(RunInfo("model.py"), trace, slice_, timelines, [])   # no tokens per step: no MFU
    assert without.modes["strict"].headline.model_flops_utilisation is None
    assert "MFU (6 x params x tokens)" not in summary_table(without, "out")


def test_mfu_is_against_the_peak_of_the_dtypes_used():
    chip = build_slice("3d:1x1x1", "v5p").chip
    int8 = Trace(renumber([mm("q.py:1", dtype="int8"), StepMarker(0, 0)]))
    peak, shares = peak_of_dtypes(int8, chip)
    assert peak == pytest.approx(chip.peak_int8_flops_per_s) and shares == {"int8": 1.0}
    assert chip.peak_int8_flops_per_s == 2 * chip.peak_bf16_flops_per_s     # v5p: int8 runs at twice bf16
    mixed = Trace(renumber([mm("q.py:1", dtype="int8"), mm("q.py:2", dtype="bfloat16")]))
    peak, shares = peak_of_dtypes(mixed, chip)
    # equal FLOPs at each dtype: the harmonic mean of the two peaks (time at peak adds up)
    assert peak == pytest.approx(2 / (1 / chip.peak_int8_flops_per_s + 1 / chip.peak_bf16_flops_per_s))
    assert shares == {"bfloat16": 0.5, "int8": 0.5}


def test_a_collective_bound_step_reads_ici_with_its_lever():
    grad = TensorMeta(9, (2**22,), "float32", 2**24, 9)
    records = []
    for step in range(3):
        records += [OpRecord(0, "aten::mm", "mxu", "bfloat16", (A, B), (C,), flops=2 * 64 * 128 * 64,
                             matmul=(1, 64, 128, 64), source="t.py:1"),
                    CollectiveRecord(0, "all_reduce", grad.nbytes, inputs=(grad,), outputs=(grad,), source="t.py:2"),
                    StepMarker(0, step)]
    trace, slice_ = Trace(renumber(records), world_size=64), build_slice("3d:4x4x4", "v5p")
    timelines = {"strict": price(trace, topology=slice_, mode=get_mode("strict"))}
    report = build_report(RunInfo("t.py"), trace, slice_, timelines, lint(trace, slice_.chip, timelines["strict"]))
    mode = report.modes["strict"]
    head = mode.headline
    assert head.bound == "ICI" and head.levers == ["comm-bound"]
    assert head.exposed_comm_share == pytest.approx(mode.step_device_s["collective_exposed"] / head.step_s)
    assert 0.5 < head.exposed_comm_share <= 1.0


def test_ranks_all_counts_per_rank_everywhere():
    from tpusim.trace.records import TraceMeta

    records = []
    for rank in range(4):
        for step in range(3):
            records += [OpRecord(0, "aten::mm", "mxu", "bfloat16", (A, B), (C,), flops=1e6, matmul=(1, 64, 128, 64),
                                 source="t.py:1", rank=rank), StepMarker(0, step, rank=rank)]
    trace, slice_ = Trace(renumber(records), world_size=4, meta=TraceMeta(ranks="all")), build_slice("2d:2x2", "v6e")
    timeline = price(trace, topology=slice_, mode=get_mode("strict"))
    assert timeline.kernels == 12 and len(timeline.chips_simulated) == 4
    report = build_report(RunInfo("t.py"), trace, slice_, {"strict": timeline})
    mode = report.modes["strict"]
    assert mode.kernels == 3 == report.program.ops          # per rank, like the op count beside it
    assert mode.steps.compiles == [1, 0, 0]                      # one rank's misses, not four ranks'
    assert mode.compile_cache.misses == 1
    table = summary_table(report, "out")
    assert "3 ops, 0 collectives, 3 steps per rank (4 ranks recorded)" in table
