"""The fidelity suite (`tpusim validate`) and the calibration files it loads.

Fast checks run by default: calibration loading and its rules, the opt-in compute terms leaving
every default number unchanged, the cases' data (sources, held-out exclusions), the quick cases
priced end to end, and the command line. The full suite (every MaxText step, minutes) is
``-m slow``.
"""

import dataclasses
import json
import math

import pytest

from tpusim.cli.main import main
from tpusim.errors import TpusimError
from tpusim.hardware.calibration import PARAMETERS, CalibratedChip, Calibration, Parameter, calibrated, load_calibration
from tpusim.hardware.compute import NO_TERMS, CalibrationTerms, calibration_terms, kernel_cost
from tpusim.hardware.spec import load_chip
from tpusim.trace.records import OpRecord
from tpusim.validate import CASES, find_case, run_case, run_cases, summarise
from tpusim.validate.case import KINDS
from tpusim.validate.maxtext import RUNS, V5E_2023, V5P_2024, Decoder, mesh_groups, step_trace
from tpusim.validate.suite import calibration_files, resolve_chip

FAST = [c for c in CASES if not c.slow]


def _matmul(m=4096, k=4096, n=4096):
    return OpRecord(seq=0, op="aten::mm", unit="mxu", dtype="bfloat16", flops=2.0 * m * k * n,
                    bytes_read=2.0 * (m * k + k * n), bytes_written=2.0 * m * n, matmul=(1, m, k, n))


# ---- calibration files and the loader ---------------------------------------------------------

@pytest.mark.parametrize("path", calibration_files(), ids=lambda p: p.stem)
def test_every_calibration_file_loads_and_names_real_cases(path):
    calibration = load_calibration(path.stem)
    assert calibration.chip == path.stem and calibration.parameters
    names = {c.name: c for c in CASES}
    for param in calibration.parameters.values():
        assert [bool(param.source), bool(param.fitted_on), bool(param.estimate)].count(True) == 1
        for case in param.fitted_on:
            assert case in names, f"{path.name}: [{param.name}] fitted on unknown case {case}"
            assert names[case].chip == calibration.chip, f"{case} is not a {calibration.chip} case"


def test_a_calibrated_chip_carries_its_terms_and_replaced_fields():
    chip = load_chip("v5p")
    calibration = Calibration("v5p", {
        "mxu_efficiency": Parameter("mxu_efficiency", 0.8, estimate="test"),
        "ici_link_efficiency": Parameter("ici_link_efficiency", 0.5, estimate="test"),
        "collective_overhead_ns": Parameter("collective_overhead_ns", 2500, estimate="test")})
    cal = calibration.apply(chip)
    assert isinstance(cal, CalibratedChip) and cal.terms == CalibrationTerms(mxu_efficiency=0.8)
    assert cal.ici_link_bytes_per_s == chip.ici_link_bytes_per_s * 0.5
    assert cal.collective_overhead_ns == 2500.0
    assert cal.peak_bf16_flops_per_s == chip.peak_bf16_flops_per_s   # the datasheet peak stays for utilisation
    assert calibrated(chip, False) is chip and calibrated(chip, None) is chip


def test_default_terms_change_no_number():
    chip = load_chip("v5e")
    plain = kernel_cost(_matmul(), chip)
    with_defaults = kernel_cost(_matmul(), CalibratedChip(**{f.name: getattr(chip, f.name)
                                                             for f in dataclasses.fields(chip)}))
    assert calibration_terms(chip) is NO_TERMS
    assert plain == with_defaults


def test_mxu_efficiency_stretches_mxu_time_only():
    chip = load_chip("v5e")
    half = Calibration("v5e", {"mxu_efficiency": Parameter("mxu_efficiency", 0.5, estimate="test")}).apply(chip)
    full, slowed = kernel_cost(_matmul(), chip), kernel_cost(_matmul(), half)
    assert full.bound == slowed.bound == "mxu"
    assert math.isclose(slowed.compute_s, 2 * full.compute_s)
    assert slowed.memory_s == full.memory_s
    assert math.isclose(slowed.mxu_utilisation, full.mxu_utilisation * full.seconds / slowed.seconds)


def test_hbm_efficiency_stretches_memory_time():
    chip = load_chip("v5e")
    copy = OpRecord(seq=0, op="aten::copy_", unit="dma", dtype="bfloat16", bytes_read=1e9, bytes_written=1e9)
    slowed = Calibration("v5e", {"hbm_efficiency": Parameter("hbm_efficiency", 0.8, estimate="t")}).apply(chip)
    assert math.isclose(kernel_cost(copy, slowed).memory_s, kernel_cost(copy, chip).memory_s / 0.8)


@pytest.mark.parametrize("body, message", [
    ('chip = "v5e"\n[warp_speed]\nvalue = 1\nestimate = "x"\n', "unknown parameter"),
    ('chip = "v5e"\n[mxu_efficiency]\nvalue = 0.9\nsource = "a"\nestimate = "b"\n', "exactly one"),
    ('chip = "v5e"\n[mxu_efficiency]\nvalue = 0.9\n', "exactly one"),
    ('chip = "v5e"\n[mxu_efficiency]\nvalue = 1.2\nestimate = "b"\n', "<= 1"),
    ('chip = "v5e"\n[mxu_efficiency]\nvalue = 0.9\nfitted_on = []\n', "non-empty list"),
    ('chip = "v5p"\n[mxu_efficiency]\nvalue = 0.9\nestimate = "b"\n', "but the file is"),
    ('chip = "v5e"\n[kernel_launch_ns]\nvalue = -1\nestimate = "b"\n', "> 0"),
])
def test_bad_calibration_files_are_refused_with_the_key(tmp_path, monkeypatch, body, message):
    (tmp_path / "calibration").mkdir()
    (tmp_path / "calibration" / "v5e.toml").write_text(body)
    monkeypatch.setenv("TPUSIM_TOPOLOGIES", str(tmp_path))
    with pytest.raises(TpusimError, match=message):
        load_calibration("v5e")


def test_every_parameter_kind_targets_a_real_field():
    chip_fields = {f.name for f in dataclasses.fields(load_chip("v5p"))}
    term_fields = {f.name for f in dataclasses.fields(CalibrationTerms)}
    for name, kind in PARAMETERS.items():
        assert kind.how in ("term", "scale", "replace"), name
        assert kind.target in (term_fields if kind.how == "term" else chip_fields), name


# ---- the cases ---------------------------------------------------------------------------------

def test_cases_have_unique_names_sources_and_published_times():
    assert len({c.name for c in CASES}) == len(CASES)
    for c in CASES:
        assert c.kind in KINDS and c.source.startswith("https://") and c.where and c.published_s > 0
        assert c.chip and c.slice and c.setup
        resolve_chip(c.chip)


def test_the_two_held_out_measurements_are_not_cases():
    """MLPerf v4.0 GPT-3 175B on one 8x8x8 v5p slice (512 chips, `v5p-1024`) and its tpu-recipes twin, the
    Trillium GPT-3 bf16 recipe, and the scaling book's latency-bound small-message all-gather measured on v5e
    (Pop Quiz 2, part 2: 8 us) must never be cases."""
    for c in CASES:
        text = f"{c.name} {c.title} {c.setup} {c.where} {c.slice}".lower()
        if "gpt3" in text or "gpt-3" in text or "mlperf" in text:
            assert "8x8x8" not in text and "v5p-1024" not in text and "512 chips" not in text, c.name
            assert "gpt3-175b-maxtext/bf16" not in text and "training/v5p/gpt3" not in text, c.name
            # the other MLPerf rounds are not cases yet; the one v6e GPT-3 case is the int8 (fp8 folder) recipe
            assert ("v4.0" in c.name and c.chip == "v5p") or "gpt3-175b-maxtext/fp8" in text, c.name
        assert not (c.chip == "v5e" and "part 2" in text)
        assert not (c.chip == "v5e" and c.kind == "measured" and c.published_s < 50e-6)


def test_maxtext_sizes_match_the_published_parameter_counts():
    # MaxText's names are the parameter counts its global_parameter_scale gives
    for run in RUNS:
        label = float(run.model_label.split()[-1].rstrip("B")) * 1e9     # "32B", "GPT-3 175B"
        assert abs(run.model.params / label - 1) < 0.05, (run.name, run.model.params)
    m32 = Decoder.from_scale(32, **V5P_2024)
    assert (m32.emb, m32.heads, m32.mlp, m32.layers) == (8192, 64, 28672, 32)
    assert (Decoder.from_scale(16, **V5E_2023).emb, Decoder.from_scale(16, **V5E_2023).layers) == (5120, 32)


def test_maxtext_published_step_is_its_flop_count_over_the_rate():
    run = next(r for r in RUNS if r.name == "maxtext-v5p-32b-v5p-128")
    # 6 N tokens + 6 H L D S^2 B (causal half of 12), per device: N = 31.66e9, tokens = 6 x 2048
    m = run.model
    tflops = (6 * m.params * 2048 * 6 + 6 * 64 * 32 * 128 * 2048 ** 2 * 6) / 1e12
    assert math.isclose(run.published_step_s(), tflops / 328)


def test_mesh_groups_put_tensor_on_one_axis_and_fsdp_on_the_rest():
    groups = mesh_groups("3d:4x4x8", load_chip("v5p"), 8, 1)
    assert groups.tensor == tuple(range(0, 128, 16)) and len(groups.fsdp) == 16 and groups.dcn == (0,)
    multislice = mesh_groups("2d:16x16", load_chip("v5e"), 1, 4)
    assert multislice.tensor == (0,) and len(multislice.fsdp) == 256 and multislice.dcn == (0, 256, 512, 768)


def test_mesh_groups_give_data_parallelism_an_axis_of_its_own():
    # MLPerf v4.0 GPT-3 on 8x8x16: tensor 8 on the first axis, data 8 on the second, fsdp 16 on the third
    groups = mesh_groups("3d:8x8x16", load_chip("v5p"), 8, 1, data=8)
    assert groups.tensor == tuple(range(8)) and groups.data == tuple(range(0, 64, 8))
    assert groups.fsdp == tuple(range(0, 1024, 64))
    with pytest.raises(ValueError, match="data parallelism"):
        mesh_groups("3d:8x8x16", load_chip("v5p"), 8, 1, data=12)


def test_a_layers_dcn_gradient_all_reduce_is_a_ring_over_the_slices_at_the_hosts_shared_rate():
    """The 32B v5e row on 32 slices: one layer's gradient shard (its matrices / 256 chips, bf16) is
    all-reduced over rank 0's DCN group, every chip of a host sending at once: 8 chips on 2 x 100 Gbps
    NICs, 3.125e9 B/s each. Ring: 2 (S-1) steps of (10 us + shard / (S x 3.125e9))."""
    from tpusim.network.collectives import simulate_collective
    from tpusim.slice.topology import build_slice

    run = next(r for r in RUNS if r.name == "maxtext-v5e-32b-32xv5e-256")
    chip = dataclasses.replace(load_chip("v5e"), collective_overhead_ns=0.0)
    groups = mesh_groups(run.topology, chip, run.tensor, run.slices)
    shard = run.model.layer_matrix_params // 256 * 2
    s = build_slice(run.topology, chip=chip, slices=run.slices)
    r = simulate_collective(s, "all_reduce", shard, group=list(groups.dcn), spmd=True)
    assert r.algorithm == "dcn" and "by ring" in r.simulated
    expected = 2 * 31 * (10e-6 + shard / 32 / 3.125e9)
    assert r.closed_form_s == pytest.approx(expected, rel=1e-9)
    assert r.time_s == pytest.approx(expected, rel=1e-3)


def _v5e_rows(model, slices):
    return {n: run_case(find_case(CASES, f"maxtext-v5e-{model}-{n}xv5e-256")) for n in slices}


@pytest.mark.slow
@pytest.mark.parametrize("model", ["16b", "32b", "64b"])
def test_multislice_steps_slow_down_with_slices_as_published(model):
    """MaxText's v5e rows slow down from 1 to 2 slices by 2.5-5.3% and never speed up with more
    slices. The prediction must never get faster with more slices, and its 1 -> 2 step must be
    within 2 points of the published one."""
    rows = _v5e_rows(model, (1, 2, 4, 32))
    pred = [rows[n].predicted_s for n in (1, 2, 4, 32)]
    assert all(b >= a * (1 - 1e-6) for a, b in zip(pred, pred[1:], strict=False))
    pub = {n: r.case.published_s for n, r in rows.items()}
    assert abs((rows[2].predicted_s / rows[1].predicted_s - 1) - (pub[2] / pub[1] - 1)) < 0.02


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="known gap (docs/fidelity.md, 'Multislice slowdown'): the published step keeps "
                   "slowing from 2 to 32 slices (+5% to +13%, a cost per layer that grows with the slice count); "
                   "tpusim's DCN all-reduces run beside the next layers' backward pass, so its prediction is flat")
def test_multislice_slowdown_from_2_to_32_slices_reaches_half_the_published():
    rows = _v5e_rows("64b", (2, 32))
    published = rows[32].case.published_s / rows[2].case.published_s - 1
    predicted = rows[32].predicted_s / rows[2].predicted_s - 1
    assert predicted >= 0.5 * published


def _mlperf(accelerator):
    return next(r for r in RUNS if r.name == f"mlperf-v4.0-gpt3-175b-{accelerator}")


def test_int8_aqt_runs_its_projection_dots_at_int8_and_the_rest_at_bf16():
    ops = [r for r in step_trace(_mlperf("v5p-2048"), load_chip("v5p"), steps=1).records if isinstance(r, OpRecord)]
    dots = {o.op: o.dtype for o in ops if o.family == "contraction"}
    assert {dtype for name, dtype in dots.items() if "proj" in name or "mlp_w" in name} == {"int8"}
    assert dots["logits"] == dots["embed_onehot"] == "bfloat16"
    assert not any("rope" in o.op for o in ops)        # GPT-3 has learned positions, no rotary embedding


def test_remat_policies_recompute_the_mlp_input_dot_only_when_it_is_not_saved():
    chip = load_chip("v5p")
    names = {p: [r.op for r in step_trace(_mlperf(a), chip, steps=1).records if isinstance(r, OpRecord)]
             for p, a in (("save_dot_except_logits_ffn1", "v5p-2048"), ("save_dot_except_logits", "v5p-12288"))}
    assert names["save_dot_except_logits_ffn1"].count("remat:mlp_wi") == 96
    assert "remat:mlp_wi" not in names["save_dot_except_logits"]


def test_an_eval_step_is_the_forward_pass_at_the_eval_batch():
    run, chip = _mlperf("v5p-2048"), load_chip("v5p")
    train = step_trace(run, chip, steps=1)
    evals = step_trace(run, chip, steps=1, train=False)
    assert evals.world_size == train.world_size == 1024
    eval_ops = [r for r in evals.records if isinstance(r, OpRecord)]
    assert not any(o.op.startswith(("bwd:", "remat:")) or o.op == "adamw" for o in eval_ops)
    qkv = {r.op: r for r in train.records if isinstance(r, OpRecord) and r.op == "qkv_proj"}["qkv_proj"]
    eval_qkv = next(o for o in eval_ops if o.op == "qkv_proj")
    assert eval_qkv.matmul[1] * run.per_device_batch == qkv.matmul[1] * run.eval_per_device_batch
    # 24567 eval sequences at one per chip: 24 eval steps per block of 12 training steps
    assert run.eval_steps_per_step == 2.0 and math.isclose(run.published_step_s(), 11.81)


def test_step_trace_is_one_rank_of_the_whole_world():
    run = next(r for r in RUNS if r.name == "maxtext-v5p-32b-v5p-128")
    trace = step_trace(run, load_chip("v5p"), steps=1)
    assert trace.world_size == 64
    ops = [r for r in trace.records if isinstance(r, OpRecord)]
    useful = sum(o.flops for o in ops if o.family in ("contraction", "attention"))
    # minimal remat: about 3 x the forward matmul FLOPs, plus the attention recompute: at least MaxText's count
    assert useful >= 0.98 * run.model.maxtext_tflops(run.per_device_batch) * 1e12


# ---- pricing -----------------------------------------------------------------------------------

def test_fast_cases_price_and_summarise():
    results = run_cases(FAST)
    assert all(math.isfinite(r.error) and r.predicted_s > 0 for r in results)
    summary = summarise(results)
    assert summary["measured"].count + summary["analytic"].count == len(FAST)
    by_name = {r.case.name: r for r in results}
    # the matmul and the reduce-scatter profiled on TPU v2 are bandwidth/compute rooflines: within 5%
    assert abs(by_name["sb-v18-ffw-matmul-v2-profile"].error) < 0.05
    assert abs(by_name["sb-c10-reducescatter-v2-profile"].error) < 0.05
    assert by_name["sb-c2-allgather-v5e-4x8-profile"].held_out
    assert not by_name["sb-c9-allgather-v5e-8x16-sweep"].held_out


def test_uncalibrated_collective_matches_the_datasheet_closed_form():
    case = find_case(CASES, "sb-c2-allgather-v5e-4x8-profile")
    # a 4-chip line, both directions: 3 x (1 us + 8.4 MB / 4.5e10) + the chip file's start-up
    expected = 3 * (1e-6 + 2048 * 8192 * 2 / 4 / 4.5e10) + load_chip("v5e").collective_overhead_ns * 1e-9
    assert math.isclose(run_case(case, calibration=False).predicted_s, expected, rel_tol=1e-6)


def test_cli_table_json_and_explain(tmp_path, capsys):
    out = tmp_path / "v.json"
    assert main(["validate", "--case", "sb-c2-allgather-v5e-4x8-profile", "--case", "sb-v18",
                 "--json", str(out), "--quiet"]) == 0
    table = capsys.readouterr().out
    assert "sb-c2-allgather-v5e-4x8-profile" in table and "all measured, held out" in table
    data = json.loads(out.read_text())
    assert [r["case"] for r in data["results"]] == ["sb-c2-allgather-v5e-4x8-profile",
                                                     "sb-v18-ffw-matmul-v2-profile"]
    assert data["summary"]["held_out"]["count"] == 2
    assert main(["validate", "--explain", "sb-c2-allgather-v5e-4x8-profile"]) == 0
    text = capsys.readouterr().out
    assert "where the predicted time goes" in text and "ici_link_efficiency" in text and "bandwidth" in text


def test_cli_refuses_an_unknown_case(capsys):
    assert main(["validate", "--case", "no-such-case"]) == 2
    assert "unknown case" in capsys.readouterr().err


def test_cli_lists_cases_with_sources(capsys):
    assert main(["validate", "--list"]) == 0
    text = capsys.readouterr().out
    assert all(c.name in text for c in CASES) and "[slow]" in text


@pytest.mark.slow
def test_full_suite_runs_and_reports_held_out_error():
    results = run_cases(CASES)
    summary = summarise(results)
    assert summary["held_out"].count > 0 and summary["held_out"].mean_abs is not None
    assert all(math.isfinite(r.error) for r in results)


@pytest.mark.slow
def test_explain_a_step_case_reports_sensitivity_to_mxu_efficiency():
    from tpusim.validate import explain

    ex = explain(find_case(CASES, "maxtext-v5p-32b-v5p-128"))
    assert "compute (mxu)" in ex.result.prediction.parts
    mxu = next(s for s in ex.sensitivities if s.parameter == "mxu_efficiency")
    assert mxu.change < -0.05          # 10% more MXU throughput: a compute-bound step gets clearly faster
