"""Faults on the slice: fault specs, routes around failures, collectives that reroute or refuse.

The headline case (issue 17, "done when") is a 1 GiB all-reduce on 3d:4x4x4 with one link gone:
the DES against a closed form for the detour written out below. Times in the comments are
microseconds; v5p numbers: one-way link W = 9e10 B/s, d = 1 us a hop, o = 1 us a collective.
"""

import dataclasses

import pytest
import simpy
from factories import tensor, toy_chip

from tpusim.cli.main import build_parser, main
from tpusim.eager.modes import get_mode
from tpusim.errors import TpusimError
from tpusim.hardware.spec import load_chip
from tpusim.network import collectives
from tpusim.network.collectives import choose_algorithm, fastforward, simulate_collective
from tpusim.network.links import Network
from tpusim.pricing import engine
from tpusim.pricing.plan import raw_plan
from tpusim.report.faults import slowdown_lines, slowdown_section
from tpusim.slice.faults import apply_faults, describe
from tpusim.slice.topology import FaultError, build_slice
from tpusim.trace.records import CollectiveRecord, OpRecord, StepMarker, Trace, renumber

GiB = 2**30


def torus(spec="3d:4x4x4", **kw):
    return build_slice(spec, **kw)


# ---- the done-when case: a rerouted all-reduce on 3d:4x4x4 ----------------------------------------

def test_one_failed_link_slows_the_4x4x4_all_reduce_by_the_detour_closed_form():
    chip = load_chip("v5p")
    W, d, o = chip.ici_link_bytes_per_s, chip.ici_hop_latency_ns * 1e-9, chip.collective_overhead_ns * 1e-9
    V = GiB
    healthy = torus()
    faulted = apply_faults(healthy, "x+@(0,0,0)")
    # The detour: with the link (0,0,0)-(1,0,0) gone, every way round is 3 hops; the first move in
    # x+, x-, y+ ... order on a shortest path is x-, so 0 -> 1 goes the long way round its own ring,
    # over that ring's x- channels, and 1 -> 0 over its x+ channels.
    assert [h[0] for h in faulted.route((0, 0, 0), (1, 0, 0))] == [(0, 0, 0), (3, 0, 0), (2, 0, 0)]
    assert [h[0] for h in faulted.route((1, 0, 0), (0, 0, 0))] == [(1, 0, 0), (2, 0, 0), (3, 0, 0)]
    assert choose_algorithm(healthy, "all_reduce", V)[0] == "multi_axis"
    assert choose_algorithm(faulted, "all_reduce", V)[0] == "multi_axis"

    # Healthy multi_axis: V in 3 parts, each visiting x, y, z in a rotated order, reduce-scatter
    # then all-gather: 6 phases, and in each phase every axis carries one part's stage of D bytes,
    # D = V/3, V/12, V/48, V/48, V/12, V/3 (sum 7V/8). A stage is a bidirectional ring of 4:
    # step 1 moves a shard s = D/4 each way, step 2 half a shard:
    #     (d + s/W) + (d + s/(2W)) = 2d + 1.5 s/W
    # so T0 = o + 6 x 2d + 1.5/4 x 7V/8 / W = o + 12d + 21V/(64W)                   (3927.7 us)
    T0 = o + 12 * d + 21 * V / (64 * W)
    # Faulted: on the x-ring through (y,z) = (0,0) the detoured step 0 -> 1 runs 3 hops over the
    # x- channels 0->3, 3->2, 2->1, each of which also carries that ring's own backward step; the
    # step 1 -> 0 likewise shares 1->2, 2->3, 3->0 with the forward steps. Every step of that
    # ring then costs 3d (the detour's hops) + 2 s/W (two transfers on one channel):
    #     x stage: (3d + 2s/W) + (3d + s/W) = 6d + 3 s/W        instead of 2d + 1.5 s/W
    # The y and z stages of the same phase are untouched, and each phase waits for its x stage:
    #     extra per phase 4d + 1.5 s/W; over the 6 phases  dT = 24d + 21V/(64W)     (3938.7 us)
    dT = 24 * d + 21 * V / (64 * W)
    base = simulate_collective(healthy, "all_reduce", V)
    hit = simulate_collective(faulted, "all_reduce", V)
    assert base.time_s == pytest.approx(T0, rel=1e-3)
    assert hit.closed_form_s == pytest.approx(T0 + dT, rel=1e-9)      # the rerouted plan's alpha-beta
    assert hit.time_s == pytest.approx(T0 + dT, rel=2e-3)             # the DES vs the closed form (about 7860 us)
    assert hit.time_s - base.time_s == pytest.approx(dT, rel=5e-3)
    assert hit.healthy_s == base.time_s and hit.slowdown == pytest.approx(2.0, rel=5e-3)
    # Only the disturbed lines are simulated in full: per phase the faulted x-ring's two streams,
    # plus one stream per shape for the 15 clean x-rings and the y and z rings.
    assert "faulted slice: 48 of 576 streams simulated" in hit.simulated
    assert hit.to_dict()["faults"] == "failed link x+@(0,0,0) (64 of 64 chips, 191 of 192 links working)"
    # More bytes cross links: the detour's two extra hops, in every phase, both directions.
    assert hit.link_bytes > base.link_bytes


def test_cli_prints_the_faulted_time_beside_the_healthy_one(capsys):
    assert main(["collective", "all_reduce", "--bytes", "64MiB", "--topology", "3d:4x4x4",
                 "--fail-links", "x+@(0,0,0)", "--json"]) == 0
    import json

    out = json.loads(capsys.readouterr().out)
    assert out["faults"].startswith("failed link x+@(0,0,0)")
    assert out["slowdown"] == pytest.approx(out["time_s"] / out["healthy_time_s"]) and out["slowdown"] > 1.5


# ---- routes -------------------------------------------------------------------------------------

def test_a_route_meeting_no_failure_is_the_dimension_order_route():
    sl = torus()
    faulted = apply_faults(sl, "y+@(3,3,3)")
    for a, b in [((0, 0, 0), (2, 1, 3)), ((1, 2, 0), (3, 0, 1))]:
        assert faulted.route(a, b) == sl.route(a, b)


def test_on_a_longer_ring_the_detour_steps_aside():
    sl = apply_faults(torus("3d:8x8x8"), "x+@(0,0,0)")
    # Around the 8-ring would be 7 hops; one line over is 3: y+, x+, y-.
    assert [(h[2], h[3]) for h in sl.route((0, 0, 0), (1, 0, 0))] == [(1, 1), (0, 1), (1, -1)]
    # A longer route keeps its length: (0,0,0) -> (2,1,0) is 3 hops with or without the link.
    assert len(sl.route((0, 0, 0), (2, 1, 0))) == 3


def test_routes_pass_around_a_failed_chip_and_never_from_or_to_it():
    sl = apply_faults(torus(), fail_chips="(1,0,0)")
    path = sl.route((0, 0, 0), (2, 0, 0))        # the straight way crosses (1,0,0)
    assert all((1, 0, 0) not in (h[0], h[1]) for h in path) and len(path) == 2   # 0 -> 3 -> 2
    with pytest.raises(FaultError, match=r"chip \(1,0,0\) has failed"):
        sl.route((0, 0, 0), (1, 0, 0))


def test_failures_that_cut_a_group_apart_name_the_collective():
    sl = apply_faults(build_slice("3d:4x1x1"), "x+@(0,0,0) x+@(2,0,0)")
    with pytest.raises(FaultError, match=r"all_reduce over 4 ranks cannot complete: no route from chip"):
        simulate_collective(sl, "all_reduce", 1e6)


def test_the_network_refuses_a_path_over_a_failed_channel():
    sl = apply_faults(torus(), "x+@(0,0,0)")
    net = Network(simpy.Environment(), sl)
    with pytest.raises(FaultError, match=r"s0 \(0,0,0\) x\+ has failed"):
        net.channel((0, (0, 0, 0), 0, 1))
    net.send((0, 0, 0), (1, 0, 0), 1e6)          # send itself goes around
    assert (0, (0, 0, 0), 0, 1) not in net.channels and (0, (0, 0, 0), 0, -1) in net.channels


# ---- collectives on a faulted slice ---------------------------------------------------------------

def test_a_group_with_a_failed_chip_cannot_run_its_collective():
    sl = apply_faults(torus(), fail_chips="(1,0,0)")
    with pytest.raises(FaultError, match=r"all_reduce over 64 ranks cannot complete: its group includes "
                                         r"failed chip \(1,0,0\) \(rank 1; --fail-chips\)"):
        simulate_collective(sl, "all_reduce", 1e6)
    # A group without it runs, and its SPMD translates include the chip's group: that fails too.
    ok = simulate_collective(sl, "all_reduce", 1e6, group=[4, 5, 6, 7])
    assert ok.time_s > 0
    with pytest.raises(FaultError, match="group of its mesh dim through rank 1"):
        simulate_collective(sl, "all_reduce", 1e6, group=[4, 5, 6, 7], spmd=True)


def test_a_fault_on_another_group_of_the_mesh_dim_slows_an_spmd_collective():
    sl = torus()
    faulted = apply_faults(sl, "x+@(0,1,0)")     # on the x-ring of ranks 4..7, not of 0..3
    alone = simulate_collective(faulted, "all_gather", 8e6, group=[0, 1, 2, 3])
    spmd = simulate_collective(faulted, "all_gather", 8e6, group=[0, 1, 2, 3], spmd=True)
    assert alone.time_s == pytest.approx(alone.healthy_s)     # its own ring is intact
    assert spmd.time_s > 1.5 * spmd.healthy_s                 # the program waits for ranks 4..7
    assert "other group(s) of its mesh dim" in spmd.simulated


@pytest.mark.parametrize("kind", ["all_gather", "all_reduce", "all_to_all", "broadcast", "reduce"])
@pytest.mark.parametrize("algorithm", ["bidi_ring", "hierarchical", "multi_axis"])
def test_folding_clean_translates_is_exact(monkeypatch, kind, algorithm):
    """merge_translates only folds streams that share no channel: the DES is the same without it."""
    sl = apply_faults(torus("3d:4x4x2", chip=toy_chip(), wrap=(True, True, False)), "x+@(0,0,0) y-@(2,1,1)")
    folded = simulate_collective(sl, kind, 4e6, algorithm=algorithm, chunk_bytes=10**6)
    collectives.build_plan.cache_clear()
    collectives._played.cache_clear()
    fastforward.clear()
    monkeypatch.setattr(collectives, "merge_translates", lambda plan, _slice: plan)
    full = simulate_collective(sl, kind, 4e6, algorithm=algorithm, chunk_bytes=10**6)
    collectives.build_plan.cache_clear()
    collectives._played.cache_clear()
    fastforward.clear()
    assert folded.time_s == pytest.approx(full.time_s, rel=1e-9)
    assert folded.link_bytes == pytest.approx(full.link_bytes, rel=1e-9)


def test_folding_interleaved_translates_is_exact(monkeypatch):
    """A strided group shares every link with its interleaved SPMD translate: the pair is one
    component, folded with the pairs of the other y-lines only when it shares nothing with them."""
    sl = apply_faults(torus("3d:8x4x1", chip=toy_chip()), "x+@(2,1,0)")
    evens = [x + 8 * y for y in range(4) for x in range(0, 8, 2)]    # x in {0,2,4,6}: a ring, 2 hops an edge
    times = []
    for merge in (True, False):
        collectives.build_plan.cache_clear()
        collectives._played.cache_clear()
        fastforward.clear()
        if not merge:
            monkeypatch.setattr(collectives, "merge_translates", lambda plan, _slice: plan)
        r = simulate_collective(sl, "all_reduce", 4e6, group=evens, spmd=True, algorithm="multi_axis",
                                chunk_bytes=10**6)
        times.append((r.time_s, r.link_bytes, r.simulated))
    collectives.build_plan.cache_clear()
    collectives._played.cache_clear()
    (folded, folded_bytes, note), (full, full_bytes, _) = times
    assert folded == pytest.approx(full, rel=1e-9) and folded_bytes == pytest.approx(full_bytes, rel=1e-9)
    assert folded > 1.2 * simulate_collective(sl.healthy, "all_reduce", 4e6, group=evens, spmd=True,
                                              algorithm="multi_axis", chunk_bytes=10**6).time_s
    kept, built = map(int, note.split("faulted slice: ")[1].split(" streams")[0].split(" of "))
    assert kept < built


def test_a_healthy_result_is_never_reused_for_a_faulted_network():
    sl = torus(chip=toy_chip())
    fastforward.clear()
    healthy = simulate_collective(sl, "all_reduce", 4e6)
    again = simulate_collective(sl, "all_reduce", 4e6)
    assert "fast-forwarded" in again.simulated
    faulted = simulate_collective(apply_faults(sl, "z-@(0,0,0)"), "all_reduce", 4e6)
    assert "fast-forwarded" not in faulted.simulated.split("healthy slice")[0]
    assert faulted.time_s > healthy.time_s


def test_faults_are_in_slice_0_of_a_multislice_run():
    sl = apply_faults(torus("3d:4x4x4", slices=2), "x+@(0,0,0)")
    result = simulate_collective(sl, "all_reduce", 64e6)
    assert result.algorithm == "dcn" and result.time_s > 1.3 * result.healthy_s
    # Slice 1's routes are the healthy ones.
    from tpusim.network.links import ici_path

    assert ici_path(sl, (0, 0, 0), (1, 0, 0), 1) == ((1, (0, 0, 0), 0, 1),)
    assert len(ici_path(sl, (0, 0, 0), (1, 0, 0), 0)) == 3


# ---- a priced program -----------------------------------------------------------------------------

def _ddp_trace(steps=2):
    records = []
    for step in range(steps):
        records += [OpRecord(0, "aten::mm", "mxu", "bfloat16", (), (tensor(1),), flops=1e9, bytes_read=1e6,
                             bytes_written=1e6),
                    CollectiveRecord(seq=0, collective="all_reduce", bytes=64e6, inputs=(tensor(1),)),
                    StepMarker(0, step)]
    return Trace(records=renumber(records), world_size=64)


def test_a_program_on_a_faulted_slice_reports_its_slowdown():
    sl = torus(chip=toy_chip())
    faulted = apply_faults(sl, "x+@(0,0,0)")
    plan = raw_plan(_ddp_trace(), sl.chip)
    healthy_tl = engine.simulate(plan, sl)
    faulted_tl = engine.simulate(plan, faulted)
    assert faulted_tl.total_s > healthy_tl.total_s
    section = slowdown_section(faulted, {"strict": faulted_tl}, {"strict": healthy_tl})
    mode = section["modes"]["strict"]
    assert mode["slowdown"] == pytest.approx(mode["step_time_median_s"] / mode["healthy_step_time_median_s"])
    assert mode["slowdown"] > 1.2 and section["failed_links"] == ["x+@(0,0,0)"]
    lines = slowdown_lines(section)
    assert lines[0].startswith("faults: failed link x+@(0,0,0)") and "on the healthy slice" in lines[1]
    assert slowdown_lines(None) == []


def test_a_failed_chip_stops_a_program_at_its_first_collective():
    sl = apply_faults(torus(chip=toy_chip()), fail_chips="(3,3,3)")
    with pytest.raises(FaultError, match=r"failed chip \(3,3,3\) \(rank 63"):
        engine.simulate(raw_plan(_ddp_trace(), sl.chip), sl)


def test_the_report_names_the_faults_and_a_healthy_slice_none():
    sl = torus()
    assert "faults" not in sl.to_dict()
    faulted = apply_faults(sl, "x+@(0,0,0) y-@(0,0,0)", "(2,2,2)")
    f = faulted.to_dict()["faults"]
    assert f["failed_links"] == ["x+@(0,0,0)", "y+@(0,3,0)"] and f["failed_chips"] == [[2, 2, 2]]
    assert f["links_lost"] == 2 + 6 and f["links_working"] == 192 - 8 and f["seed"] is None
    assert describe(faulted) == ("failed links x+@(0,0,0) y+@(0,3,0); chip (2,2,2) (63 of 64 chips, "
                                 "184 of 192 links working)")
    assert faulted.healthy == sl and faulted != sl


# ---- fault specs --------------------------------------------------------------------------------

def test_a_count_is_drawn_by_the_seed_reproducibly():
    sl = torus()
    a = apply_faults(sl, "5", seed="7")
    assert len(a.faults.links) == 5 and a.faults.seed == 7
    assert a.faults == apply_faults(sl, 5, seed=7).faults
    assert a.faults.links != apply_faults(sl, "5", seed="8").faults.links
    assert apply_faults(sl, "3").faults.seed == 0                 # no seed: seed 0, recorded
    chips = apply_faults(sl, fail_chips="2", seed=1)
    assert len(chips.faults.chips) == 2 and not chips.faults.links
    assert apply_faults(sl, "0") == sl and apply_faults(sl, None, None, None) is sl


def test_lists_accept_separators_and_short_coordinates():
    sl = torus()
    both = apply_faults(sl, " x+@(0,0,0) ,y-@( 1, 2, 3 );z+@(3,3,3)")
    assert both.faults.links == {((0, 0, 0), 0), ((1, 1, 3), 1), ((3, 3, 3), 2)}
    flat = apply_faults(build_slice("2d:4x4", chip="v5p"), "x+@(1,2)")   # 4x4x1 on v5p: z may be left out
    assert flat.faults.links == {((1, 2, 0), 0)}


BAD_SPECS = [
    (["--fail-links", "w+@(0,0,0)"], "unknown axis 'w'; slice 3d:4x4x4 has axes x, y, z"),
    (["--fail-links", "x+@(4,0,0)"], r"chip \(4,0,0\) is outside slice 3d:4x4x4"),
    (["--fail-links", "x+@(0,0)"], "a chip is 3 numbers, not 2"),
    (["--fail-links", "x+@(3,0,0)", "--no-wrap"], r"no such link \(axis x does not wrap in 3d:4x4x4, so chip "
                                                  r"\(3,0,0\) at its end has no x\+ link\)"),
    (["--fail-links", "x-@(0,1,2)", "--no-wrap"], "at its start has no x- link"),
    (["--fail-links", "193"], r"--fail-links 193: more failures than slice 3d:4x4x4 has links \(192\)"),
    (["--fail-links", "99999999999999"], "more failures than slice 3d:4x4x4 has links"),
    (["--fail-chips", "65"], r"--fail-chips 65: more failures than slice 3d:4x4x4 has chips \(64\)"),
    (["--fail-chips", "(0,0,9)"], r"chip \(0,0,9\) is outside slice"),
    (["--fail-links", "x+@(0,0,0) x-@(1,0,0)"], r"listed twice \(x\+@\(0,0,0\) names the same link\)"),
    (["--fail-chips", "(1,1,1) (1,1,1)"], "listed twice"),
    (["--fail-links", "x+@(0,0,0)", "--fault-seed", "3"], "--fault-seed 3 chooses the failures of a count"),
    (["--fail-links", "2", "--fault-seed", "-1"], "--fault-seed '-1' is not a whole number"),
    (["--fail-links", "x+(0,0,0)"], "cannot read 'x\\+\\(0,0,0\\)'"),
    (["--fail-links", "x+@(0,0,0)\t"], "contains a control character"),
    (["--fail-links", "x+@(٠,0,0)"], "contains a non-ASCII character"),
]


@pytest.mark.parametrize(("flags", "message"), BAD_SPECS)
def test_every_bad_fault_spec_is_one_clear_error_with_exit_code_2(capsys, flags, message):
    argv = ["collective", "all_reduce", "--bytes", "1MiB", "--topology", "3d:4x4x4", *flags]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tpusim collective: error: ")
    assert __import__("re").search(message, err), err


def test_a_link_along_an_axis_of_length_one_does_not_exist():
    with pytest.raises(TpusimError, match="no such link \\(axis z has length 1\\)"):
        apply_faults(build_slice("2d:4x4", chip="v5p"), "z+@(0,0,0)")


def test_run_and_compare_take_the_fault_flags():
    parser = build_parser()
    run = parser.parse_args(["run", "model.py", "--fail-links", "x+@(0,0,0)", "--fail-chips", "2",
                             "--fault-seed", "4"])
    assert (run.fail_links, run.fail_chips, run.fault_seed) == ("x+@(0,0,0)", "2", "4")
    compare = parser.parse_args(["compare", "reports/a", "--fail-links", "3"])
    assert compare.fail_links == "3" and compare.fail_chips is None


def test_compare_reprices_a_report_on_the_faulted_slice(tmp_path, capsys):
    from tpusim.pricing import price
    from tpusim.report import RunInfo, build_report, write_report
    from tpusim.trace.records import write_trace

    sl = torus()
    trace = _ddp_trace()
    timelines = {"strict": price(trace, topology=sl, mode=get_mode("strict"))}
    report = build_report(RunInfo(script="ddp.py", topology=sl.spec), trace, sl, timelines)
    write_trace(trace, tmp_path / "program.jsonl")
    write_report(tmp_path, report, timelines)
    assert main(["compare", str(tmp_path), "--fail-links", "x+@(0,0,0)", "--json"]) == 0
    import json

    rows = {r["metric"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    # B (faulted) / A (healthy): the detour's closed form (test_a_failed_link_...'s T0 and dT) for V = 64 MB
    chip = sl.chip
    W, d, o = chip.ici_link_bytes_per_s, chip.ici_hop_latency_ns * 1e-9, chip.collective_overhead_ns * 1e-9
    moved = 21 * 64e6 / (64 * W)
    assert rows["collectives exposed"]["ratio"] == pytest.approx(1 + (24 * d + moved) / (o + 12 * d + moved), rel=0.02)
    assert rows["whole program"]["ratio"] > 1.0


def test_a_faulted_slice_differs_from_its_healthy_one_only_in_faults():
    sl = torus()
    f = apply_faults(sl, "1")
    assert dataclasses.replace(f, faults=sl.faults) == sl and f.chip is sl.chip and f.spec == sl.spec
