"""The link heat map covers the whole slice over the steady-state step; collectives are grouped by call site;
values below the simulator's resolution print as 0."""

import pytest
from factories import A, B, C

from tpusim.eager.modes import get_mode
from tpusim.pricing import price
from tpusim.report import RunInfo, build_report
from tpusim.report.collectives import group_collectives
from tpusim.report.text import percent_text, ratio_text, seconds_text, tflops_text
from tpusim.slice.topology import build_slice
from tpusim.trace.records import CollectiveRecord, OpRecord, StepMarker, TensorMeta, Trace, renumber

GRAD = TensorMeta(9, (2**20,), "float32", 2**22, 9)


def tp_trace(steps: int = 3, gathers: int = 4) -> Trace:
    """Each step: a matmul, ``gathers`` identical all-gathers over the x line (ranks 0-3 of a 4x4x4 slice: a
    tensor-parallel group) from one source line, and one all-reduce over the whole slice from another."""
    records = []
    for step in range(steps):
        records.append(OpRecord(0, "aten::mm", "mxu", "bfloat16", (A, B), (C,), flops=2 * 64 * 128 * 64,
                                matmul=(1, 64, 128, 64), source="tp.py:3"))
        records += [CollectiveRecord(0, "all_gather", GRAD.nbytes, (0, 1, 2, 3), inputs=(GRAD,), outputs=(GRAD,),
                                     source="tp.py:5") for _ in range(gathers)]
        records += [CollectiveRecord(0, "all_reduce", GRAD.nbytes, inputs=(GRAD,), outputs=(GRAD,),
                                     source="tp.py:7"), StepMarker(0, step)]
    return Trace(renumber(records), world_size=64)


@pytest.fixture(scope="module")
def tp_report():
    trace, slice_ = tp_trace(), build_slice("3d:4x4x4", "v5p")
    timeline = price(trace, topology=slice_, mode=get_mode("strict"))
    return timeline, build_report(RunInfo("tp.py"), trace, slice_, {"strict": timeline}).to_dict()["modes"]["strict"]


def test_heat_map_lights_every_chip_of_the_slice_by_symmetry(tp_report):
    timeline, mode = tp_report
    links = mode["links"]
    simulated_chips = {tuple(c.key[1]) for c in timeline.link_stats.channels if c.busy_s > 0}
    assert len(simulated_chips) < 64                 # the simulator ran representative lines only...
    per_chip = {tuple(coord): u for coord, u in links["per_chip"]}
    assert len(per_chip) == 64                       # ...the map shows every chip of the 4x4x4 slice
    # every x line carries the same tensor-parallel traffic: all chips equally busy (the slice is uniform)
    assert max(per_chip.values()) == pytest.approx(min(per_chip.values()), rel=1e-6)
    assert links["busy_links"] == 64 * 6 and links["simulated_links"] < links["busy_links"]
    assert {b["simulated"] for b in links["busiest"]} == {True, False}     # the busiest: simulated and expanded
    # per axis: the x links carry the tensor-parallel all-gathers and the all-reduce, y and z the all-reduce only
    for _, (x, y, z) in links["per_chip_axis"]:
        assert x > y > 0 and y == pytest.approx(z, rel=1e-6)


def test_link_utilisation_is_measured_over_the_steady_state_step(tp_report):
    timeline, mode = tp_report
    whole_program = timeline.link_stats.max_utilisation
    steady = mode["links"]["max_utilisation"]
    assert mode["links"]["window_s"] == pytest.approx(timeline.steps[-1].end_s - timeline.steps[1].start_s)
    # the first step's compile estimate (50 ms) dilutes the whole-program figure; the steady window does not
    assert steady > 10 * whole_program and steady <= 1.0


def test_collectives_are_grouped_by_kind_group_bytes_and_source(tp_report):
    _, mode = tp_report
    groups = {(g["kind"], g["source"]): g for g in mode["collective_groups"]}
    assert set(groups) == {("all_gather", "tp.py:5"), ("all_reduce", "tp.py:7")}
    gather = groups[("all_gather", "tp.py:5")]
    calls = [c for c in mode["collectives"] if c["kind"] == "all_gather"]
    assert gather["count"] == len(calls) == 12 and gather["group_size"] == 4
    assert gather["total_s"] == pytest.approx(sum(c["time_s"] for c in calls))
    assert gather["total_bytes"] == sum(c["bytes"] for c in calls)
    assert groups[("all_reduce", "tp.py:7")]["count"] == 3


def test_contention_below_the_resolution_is_zero():
    calls = [{"kind": "all_reduce", "group_size": 8, "axes": ["x"], "bytes": 4, "source": "a.py:1",
              "algorithm": "ring", "time_s": 1e-3, "closed_form_s": 1e-3, "contention_s": 1.559e-19}]
    (group,) = group_collectives(calls)
    assert group["contention_total_s"] == 0.0 and seconds_text(1.559e-19) == "0"
    assert seconds_text(6.727e-16) == "0" and seconds_text(2e-9) == "2 ns" and seconds_text(None) == "-"


def test_small_shares_keep_their_digits_and_zero_ratios_are_not_ratios():
    assert percent_text(0.000042) == "0.0042%" and percent_text(0.123) == "12.3%" and percent_text(0.0) == "0%"
    assert ratio_text(0.0, 0.0) == "-" and ratio_text(1e-20, 4e-19) == "-" and ratio_text(2.0, 5.0) == "2.5x"


def test_a_toy_program_on_a_big_chip_prints_zero_utilisation_not_exponents():
    # Issue 31: a few FLOPs on a v5p printed "TFLOP/s per chip 1.82e-10" and "MFU 4e-11%".
    assert percent_text(4e-13) == "0%" and percent_text(-4e-13) == "0%" and percent_text(2e-6) == "0.0002%"
    assert tflops_text(1.82e-10) == "0" and tflops_text(0.00123) == "0.00123" and tflops_text(212.345) == "212"


def test_an_idle_network_collective_has_no_contention():
    records = [CollectiveRecord(0, "all_reduce", GRAD.nbytes, inputs=(GRAD,), outputs=(GRAD,), source="a.py:1"),
               StepMarker(0, 0)]
    trace, slice_ = Trace(renumber(records), world_size=64), build_slice("3d:4x4x4", "v5p")
    report = build_report(RunInfo("a.py"), trace, slice_, {"strict": price(trace, topology=slice_)})
    (call,) = report.to_dict()["modes"]["strict"]["collectives"]
    assert call["contention_s"] == 0.0          # alone on an idle network: the DES equals the closed form


def test_the_collectives_table_says_when_it_counts_every_rank_and_trace_json_its_window():
    # Issue 31: under --ranks all the table summed calls over ranks while the header counted one rank's, and
    # trace.json's link shares (whole program) and report.html's (steady step) disagreed without saying so.
    from tpusim.report.html import collective_groups
    from tpusim.report.perfetto import perfetto_trace

    trace, slice_ = tp_trace(), build_slice("3d:4x4x4", "v5p")
    timeline = price(trace, topology=slice_, mode=get_mode("strict"))
    mode = build_report(RunInfo("tp.py"), trace, slice_, {"strict": timeline}).modes["strict"]
    assert collective_groups(mode, 1)["scope"] == ""
    assert "every process group of the 4 ranks recorded" in collective_groups(mode, 4)["scope"]
    assert "busy share is over the whole program" in perfetto_trace(timeline, "strict")["otherData"]["note"]
