"""The cost report: schema, determinism, self-contained HTML, valid Perfetto trace, lint warnings."""

import json

import pytest
from factories import B, C, training_trace

from tpusim.eager.modes import get_mode, resolve_modes
from tpusim.errors import TpusimError
from tpusim.pricing import price
from tpusim.report import RunInfo, build_report, summary_table, write_report
from tpusim.report.lint import RULES, LintWarning, lint
from tpusim.report.model import SCHEMA_VERSION
from tpusim.slice.topology import build_slice
from tpusim.trace.records import OpRecord, StepMarker, TensorMeta, Trace, renumber


@pytest.fixture(scope="module")
def priced():
    trace = training_trace()
    slice_ = build_slice("3d:1x1x1", "v5p")
    timelines = {mode: price(trace, topology=slice_, mode=get_mode(mode)) for mode in ("debug", "strict")}
    report = build_report(RunInfo("model.py", argv=("--steps", "3")), trace, slice_, timelines,
                          lint(trace, slice_.chip, timelines["strict"]))
    return trace, slice_, timelines, report


def test_report_has_the_documented_sections(priced):
    report = priced[3].to_dict()                # report.json's content
    assert report["schema"] == "tpusim-report" and report["version"] == SCHEMA_VERSION
    assert report["complete"] is True and report["error"] is None
    assert report["run"]["modes"] == ["debug", "strict"] and report["run"]["argv"] == ["--steps", "3"]
    strict = report["modes"]["strict"]
    assert len(strict["steps_s"]) == 3
    # the device split sums to the whole program (per chip)
    assert sum(strict["device_s"].values()) == pytest.approx(strict["total_s"], rel=1e-6)
    assert strict["top_ops"][0]["source"].startswith("model.py:")
    assert strict["hbm"]["peak_bytes"] == C.nbytes
    assert report["program"] == {"ops": 6, "collectives": 0, "syncs": 3, "steps": 3, "ranks_recorded": 1,
                                 "model_flops": 3 * (2 * 64 * 128 * 64 + 8 * 64 * 64)}


def test_debug_is_never_faster_than_strict(priced):
    _, _, _, report = priced
    assert report.modes["debug"].total_s >= report.modes["strict"].total_s


def test_lint_flags_the_sync_in_the_loop_and_the_half_empty_mxu(priced):
    trace, slice_, timelines, report = priced
    warnings = lint(trace, slice_.chip, timelines["strict"])
    assert all(isinstance(w, LintWarning) and w.code in RULES for w in warnings)
    codes = {(w.code, w.source) for w in warnings}
    assert ("host-sync", "model.py:5") in codes
    assert ("mxu-padding", "model.py:3") in codes  # n = 64 on a 128-wide MXU: half the tile idle
    # report.json holds them as {code, message, source}, in the order of the rules table
    assert report.to_dict()["warnings"] == [{"code": w.code, "message": w.message, "source": w.source}
                                            for w in warnings]
    assert [w.code for w in warnings] == sorted((w.code for w in warnings), key=list(RULES).index)


def test_report_json_is_deterministic(priced, tmp_path):
    trace, slice_, timelines, report = priced
    again = build_report(RunInfo("model.py", argv=("--steps", "3")), trace, slice_,
                         {mode: price(trace, topology=slice_, mode=get_mode(mode)) for mode in timelines},
                         lint(trace, slice_.chip, timelines["strict"]))
    write_report(tmp_path / "a", report, timelines)
    write_report(tmp_path / "b", again, timelines)
    assert (tmp_path / "a" / "report.json").read_bytes() == (tmp_path / "b" / "report.json").read_bytes()


def test_html_is_self_contained_with_the_figures(priced, tmp_path):
    _, _, timelines, report = priced
    out = write_report(tmp_path, report, timelines)
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") >= 3 and "src=\"http" not in page
    for name in ("modes", "breakdown", "roofline"):
        assert (out / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_perfetto_trace_has_host_and_tensorcore_tracks(priced, tmp_path):
    _, _, timelines, report = priced
    out = write_report(tmp_path, report, timelines)
    events = json.loads((out / "trace.json").read_text())["traceEvents"]
    tracks = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"host", "tensorcore"} <= tracks
    spans = [e for e in events if e["ph"] == "X"]
    assert spans and all(e["dur"] > 0 and e["ts"] >= 0 for e in spans)
    assert any(e["args"].get("source") == "model.py:3" for e in spans)


def test_summary_table_has_one_column_per_mode(priced):
    _, _, _, report = priced
    table = summary_table(report, "reports/x")
    lines = table.splitlines()
    assert lines[1].startswith("priced by tpusim's model; validated error (")      # who priced, how far to trust
    assert "debug" in lines[2] and "strict" in lines[2]
    assert "reports/x/report.html" in table


def test_unknown_mode_is_refused_with_the_accepted_names():
    with pytest.raises(TpusimError, match="accepted: debug, strict"):
        resolve_modes("turbo")


def test_collectives_and_link_heat_map_are_reported(tmp_path):
    from tpusim.trace.records import CollectiveRecord

    grad = TensorMeta(9, (2**20,), "float32", 2**22, 9)
    records = renumber([CollectiveRecord(0, "all_reduce", grad.nbytes, reduce_op="sum", inputs=(grad,),
                                         outputs=(grad,), source="train.py:7"), StepMarker(0, 0)])
    trace, slice_ = Trace(records, world_size=64), build_slice("3d:4x4x4", "v5p")
    timelines = {"strict": price(trace, topology=slice_, mode=get_mode("strict"))}
    report = build_report(RunInfo("train.py"), trace, slice_, timelines)
    data = report.to_dict()                     # report.json's content
    (entry,) = data["modes"]["strict"]["collectives"]
    assert entry["kind"] == "all_reduce" and entry["bytes"] == 2**22 and entry["source"] == "train.py:7"
    # an idle network: the simulated time and the closed form agree (the simulator's own tests check 1%)
    assert entry["time_s"] == pytest.approx(entry["closed_form_s"], rel=0.02)
    links = data["modes"]["strict"]["links"]
    assert 0 < links["max_utilisation"] <= 1 and links["per_chip"]
    out = write_report(tmp_path, report, timelines)
    assert (out / "links.png").exists()
    events = json.loads((out / "trace.json").read_text())["traceEvents"]
    link_tracks = [e for e in events if e["ph"] == "M" and e["name"] == "thread_name" and "busy)" in e["args"]["name"]]
    busy = [e for e in events if e.get("cat") == "ici" and e["ph"] == "X"]
    assert link_tracks and busy
    # a link is never busier than the collective lasted
    assert max(e["dur"] for e in busy) <= entry["time_s"] * 1e6 * (1 + 1e-9)


def test_lint_reports_recompilations_with_their_source_line():
    # the same line runs a matmul of 64 rows, then 37 (a last partial batch): the second shape recompiles
    records = []
    for step, rows in enumerate((64, 64, 37)):
        a = TensorMeta(1, (rows, 128), "bfloat16", rows * 256, 1)
        c = TensorMeta(3, (rows, 128), "bfloat16", rows * 256, 3)
        records += [OpRecord(0, "aten::mm", "mxu", "bfloat16", (a, B), (c,), flops=2 * rows * 128 * 128,
                             bytes_read=a.nbytes + B.nbytes, bytes_written=c.nbytes, matmul=(1, rows, 128, 128),
                             source="train.py:9"), StepMarker(0, step)]
    trace, slice_ = Trace(renumber(records)), build_slice("3d:1x1x1", "v5p")
    warnings = lint(trace, slice_.chip, price(trace, topology=slice_, mode=get_mode("strict")))
    assert [(w.code, w.source) for w in warnings if w.code == "recompile"] == [("recompile", "train.py:9")]


def test_lint_flags_collectives_that_compute_cannot_hide():
    from tpusim.trace.records import CollectiveRecord

    grad = TensorMeta(9, (2**20,), "float32", 2**22, 9)
    trace = Trace(renumber([CollectiveRecord(0, "all_reduce", grad.nbytes, inputs=(grad,), outputs=(grad,)),
                            StepMarker(0, 0)]), world_size=64)
    slice_ = build_slice("3d:4x4x4", "v5p")
    warnings = lint(trace, slice_.chip, price(trace, topology=slice_, mode=get_mode("strict")))
    (bound,) = [w for w in warnings if w.code == "comm-bound"]
    assert "2550 tokens per chip" in bound.message  # 4.59e14 FLOP/s / (2 x 9e10 B/s), the scaling book's figure


def test_measured_section_sets_real_times_beside_the_prediction(priced, tmp_path):
    from tpusim.report import Measured, measured_section
    from tpusim.report.measured import JaxDevice, ModeRun, not_tpu_note

    trace, slice_, timelines, report = priced
    runs = (ModeRun("debug", (2.0, 0.3, 0.5, 0.4), 3.2, target_mode="debug"),
            ModeRun("strict", (1.0, 0.2, 0.2), 1.4, target_mode="strict"),
            ModeRun("fused", (0.5,), None, exit_code=1, error_type="RuntimeError", error="Traceback ...\n"))
    on_cpu = Measured(JaxDevice("cpu", "cpu", "0.10.2"), "v5p", "default", runs)
    cpu = measured_section(on_cpu, report.to_dict()["modes"])
    assert cpu["baseline"] == "strict" and cpu["notes"] == [not_tpu_note("cpu")]
    debug, strict, fused = (cpu["modes"][m] for m in ("debug", "strict", "fused"))
    assert (debug["steps"], debug["first_step_s"], debug["step_time_median_s"]) == (4, 2.0, 0.4)
    assert debug["ratio"]["measured"] == pytest.approx(0.4 / 0.2)
    assert debug["ratio"]["simulated"] == pytest.approx(report.modes["debug"].step_time_median_s
                                                        / report.modes["strict"].step_time_median_s)
    assert strict["ratio"] == {"measured": 1.0, "simulated": 1.0}
    assert fused["error"]["type"] == "RuntimeError" and fused["step_time_median_s"] == 0.5  # one step: its own
    assert fused["simulated_step_time_median_s"] is None and fused["ratio"]["simulated"] is None  # not priced
    # on a TPU tpusim knows, no note; on one it has no chip for, or with --chip, the note says what was priced
    tpu = JaxDevice("tpu", "TPU v5 lite", "0.10.2")
    assert measured_section(Measured(tpu, "v5e", "device", runs[:1]), report.to_dict()["modes"])["notes"] == []
    assert measured_section(Measured(tpu, "v5e", "device", runs[:1]), report.to_dict()["modes"])["baseline"] == "debug"
    assert "--chip" in measured_section(Measured(tpu, "v5p", "--chip", runs), report.to_dict()["modes"])["notes"][0]
    full = build_report(RunInfo("model.py", argv=("--steps", "3")), trace, slice_, timelines,
                        lint(trace, slice_.chip, timelines["strict"]), measured=on_cpu)
    assert {k: v for k, v in full.to_dict().items() if k != "measured"} == report.to_dict()   # the rest: the same
    assert full.measured.modes["debug"].ratio.measured == pytest.approx(0.4 / 0.2)
    table = summary_table(full, "reports/x")
    assert "vs strict, measured" in table and f"note: {not_tpu_note('cpu')}" in table
    assert "measured fused: the run failed with RuntimeError" in table
    page = (write_report(tmp_path, full, timelines) / "report.html").read_text()
    assert "Measured on the PJRT target" in page and "Traceback ..." in page
    assert json.loads((tmp_path / "report.json").read_text())["measured"]["modes"]["strict"]["steps"] == 3


def test_distributed_and_placement_sections_come_from_their_typed_parts():
    from tpusim.placement import compare, distributed_info
    from tpusim.trace.records import CollectiveRecord, Mesh, TraceMeta

    records = []
    for step in (1, 2):
        records += [CollectiveRecord(0, "all_reduce", 1 << 20, (0, 1), mesh_axis="tp"), StepMarker(0, step)]
    meta = TraceMeta(ranks="one", meshes=(Mesh(("dp", "tp"), (4, 2), tuple(range(8))),))
    trace, slice_ = Trace(renumber(records), world_size=8, meta=meta), build_slice("3d:2x2x2", "v5p")
    timelines = {"strict": price(trace, topology=slice_)}
    report = build_report(RunInfo("train.py"), trace, slice_, timelines, distributed=distributed_info(trace, slice_),
                          placements=compare(trace, slice_, lambda t, s: price(t, topology=s)))
    data = report.to_dict()                     # report.json's content
    assert data["distributed"] == {"ranks": "one", "world_size": 8, "placement": "tp=x,dp=yz", "numerics_rule": "",
                                     "not_reference_correct": []}
    placements = data["placements"]
    assert placements["mesh"] == {"dim_names": ["dp", "tp"], "shape": [4, 2]} and placements["default"] == "tp=x,dp=yz"
    assert set(placements["ranked"][0]) == {"placement", "total_s", "step_s", "collective_s", "by_dim", "axes",
                                            "algorithms"}
    assert json.loads(json.dumps(data)) == data        # plain JSON all the way down
    assert "distributed" not in build_report(RunInfo("train.py"), trace, slice_, timelines).to_dict()


def test_report_json_is_strict_json_even_when_a_value_is_not_finite():
    # Issue 32, row 10: a non-finite value was written as bare NaN/Infinity, which no strict JSON reader accepts.
    import math

    from factories import training_trace

    from tpusim.report import report_json

    trace, slice_ = training_trace(), build_slice("3d:1x1x1")
    timelines = {"strict": price(trace, topology=slice_, mode=get_mode("strict"))}
    report = build_report(RunInfo("m.py"), trace, slice_, timelines)
    broken = report.model_copy(update={"modes": {"strict": report.modes["strict"].model_copy(
        update={"mxu_utilisation": math.nan, "hbm_bytes_moved": math.inf})}})

    def refuse(constant: str) -> None:
        raise AssertionError(f"not strict JSON: {constant}")

    mode = json.loads(report_json(broken), parse_constant=refuse)["modes"]["strict"]
    assert mode["mxu_utilisation"] is None and mode["hbm_bytes_moved"] is None
