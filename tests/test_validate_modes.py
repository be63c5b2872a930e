"""Per-mode validation: the TorchTitan recipes' cases (tpusim/validate/torchtitan.py), each mode's error band
(tpusim/validate/bands.py) and the band every report prints beside the mode (tpusim/report/fidelity.py).

Truths: the step a case compares with is the published row's own arithmetic (local batch x sequence / TPS); a
small copy of the recipes' script records through `tpusim run` in both of its modes (the eager one without a
compiled graph, the compiled one with its layers' attention inside the graph); the band is the mean and max of
the held-out cases' |error|, and a report reads back exactly what was written."""

from __future__ import annotations

import dataclasses

import pytest

from tpusim.hardware import calibration
from tpusim.report import fidelity
from tpusim.trace.records import OpRecord
from tpusim.validate import CASES, Case, Prediction, Result
from tpusim.validate.bands import mode_bands, write_bands
from tpusim.validate.product import case, recording
from tpusim.validate.suite import chip_for
from tpusim.validate.torchtitan import CONFORMER_FRAMES, RUNS, SEQ


def test_each_row_is_its_published_arithmetic_in_its_mode() -> None:
    for run in (r for r in RUNS if r.family == "afmv7-3b-lora"):
        if "tokens/s" not in run.published:
            continue                                            # a row that publishes its step time
        batch = int(run.args[run.args.index("--batch") + 1])
        seq = int(run.args[run.args.index("--seq") + 1]) if "--seq" in run.args else SEQ
        tps = int(run.published.split(" ")[0].replace(",", ""))
        assert run.published_s == pytest.approx(batch * seq / tps)
        assert run.args[run.args.index("--compile") + 1] == ("layers" if run.mode == "compile" else "none")
        assert "afmv7/" not in run.where.replace("afmv7_lora/", "")      # the full fine-tune rows: held out
    assert {c.mode for c in CASES if c.name.startswith("titan-")} == {"compile", "fused"}


@pytest.mark.slow      # about 40 s: two small recordings
@pytest.mark.parametrize("mode", ["compile", "fused"])
def test_a_small_copy_records_in_its_mode(tmp_path, monkeypatch, mode) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    recording.cache_clear()
    base = next(r for r in RUNS if r.mode == mode and r.family == "afmv7-3b-lora" and r.accelerator == "v6e-8")
    small = ("--layers", "3", "--kv-reuse", "1", "--d-model", "256", "--heads", "4", "--kv-heads", "2",
             "--vocab", "2048", "--seq", "256", "--loss-chunk", "128", "--batch", "1", "--steps", "3",
             "--compile", "layers" if mode == "compile" else "none")
    run = dataclasses.replace(base, name=f"titan-test-{mode}", args=small)
    trace, report = recording(run)
    in_graphs = {op.op for op in trace.of_kind(OpRecord) if op.program > 0}
    if mode == "compile":
        assert "tpu::splash_attention" in in_graphs
    else:
        assert not in_graphs
    prediction = case(run).predict(chip_for(case(run)))
    assert prediction.seconds == pytest.approx(report["modes"]["fused"]["step_time_median_s"], rel=1e-9)


def test_each_conformer_row_is_its_published_arithmetic() -> None:
    rows = {r.mode: r for r in RUNS if r.family == "conformer"}
    # the README's lines at the pinned date: 89,000 and 59,000 frames/s per chip, local batch 512 x 512 frames
    assert rows["compile"].published_s == pytest.approx(512 * 512 / 89000)
    assert rows["fused"].published_s == pytest.approx(512 * 512 / 59000)
    for run in rows.values():
        batch, tps = int(run.args[run.args.index("--batch") + 1]), int(run.published.split(" ")[0].replace(",", ""))
        assert run.published_s == pytest.approx(batch * CONFORMER_FRAMES / tps)
        assert run.args[run.args.index("--compile") + 1] == ("layers" if run.mode == "compile" else "none")
    # the compile row passes no eager mode: the rest runs in TorchTPU's default DEFER_NEVER (Strict)
    assert (rows["compile"].eager, rows["fused"].eager) == ("strict", "fused")


@pytest.mark.slow      # about 2 minutes: two small recordings
@pytest.mark.parametrize("mode", ["compile", "fused"])
def test_a_small_conformer_records_in_its_mode(tmp_path, monkeypatch, mode) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    recording.cache_clear()
    base = next(r for r in RUNS if r.mode == mode and r.family == "conformer")
    small = ("--layers", "2", "--d-model", "128", "--heads", "2", "--kernel", "7", "--vocab", "16", "--seq", "128",
             "--ctc-targets", "8", "--batch", "2", "--steps", "3",
             "--compile", "layers" if mode == "compile" else "none")
    run = dataclasses.replace(base, name=f"titan-test-conformer-{mode}", args=small)
    trace, report = recording(run)
    ops = {op.op for op in trace.of_kind(OpRecord)}
    in_graphs = {op.op for op in trace.of_kind(OpRecord) if op.program > 0}
    assert {"aten::_ctc_loss", "aten::_ctc_loss_backward"} & ops          # the CTC loss records (shape-only)
    if mode == "compile":
        assert "tpu::splash_attention" in in_graphs and run.eager in report["modes"]
    else:
        assert not in_graphs
    prediction = case(run).predict(chip_for(case(run)))
    # report.json keeps 9 significant digits
    assert prediction.seconds == pytest.approx(report["modes"][run.eager]["step_time_median_s"], rel=1e-8)


def _result(name: str, mode: str, error: float, held_out: bool = True, compiler: str = "model") -> Result:
    c = Case(name=name, title=name, kind="measured", chip="v6e", slice="2d:2x4", setup="", published="1 s",
             published_s=1.0, source="", where="", predict=lambda chip: Prediction(1.0 + error), path="product",
             mode=mode, compiler=compiler)
    return Result(c, 1.0 + error, Prediction(1.0 + error), calibrated=True, held_out=held_out)


def test_only_a_mode_whose_every_case_ran_may_have_its_band_written() -> None:
    from tpusim.validate.bands import complete_modes

    fused = [c for c in CASES if c.path == "product" and c.mode == "fused"]
    results = [Result(c, 1.0, Prediction(1.0), calibrated=True, held_out=True) for c in fused]
    assert complete_modes(results, list(CASES)) == {"fused"}
    assert complete_modes(results[1:], list(CASES)) == set()


def test_a_modes_band_is_its_held_out_cases_and_the_report_reads_it(tmp_path, monkeypatch) -> None:
    results = [_result("a", "fused", -0.07), _result("b", "fused", 0.03), _result("c", "compile", 0.11),
               _result("fit", "compile", 0.5, held_out=False), _result("c@xla", "compile", -0.3, compiler="xla")]
    bands = mode_bands(results)
    assert bands["fused"] == {"cases": 2, "mean_abs_error": pytest.approx(0.05), "max_abs_error": pytest.approx(0.07),
                              "worst": "a"}
    assert bands["compile"]["cases"] == 1 and "strict" not in bands        # a fit case is no evidence
    assert bands["compile@xla"]["max_abs_error"] == pytest.approx(0.3)      # each compiler path its own band
    path = tmp_path / "error_bands.toml"
    write_bands(results, {"fused", "compile", "compile@xla"}, path)
    write_bands([_result("d", "strict", 0.2)], {"strict"}, path)       # keeps the other modes' tables
    monkeypatch.setattr(calibration, "error_bands_path", lambda: path)
    calibration.error_bands.cache_clear()
    try:
        assert fidelity.fidelity("fused", ran_compiled=True, compiler="xla")["max_abs_error"] == pytest.approx(0.3)
        fused = fidelity.fidelity("fused", ran_compiled=False)
        assert fused["cases"] == 2 and fused["max_abs_error"] == pytest.approx(0.07)
        assert fidelity.fidelity("fused", ran_compiled=True)["validated_as"] == "compile"
        assert fidelity.fidelity("strict", ran_compiled=False)["max_abs_error"] == pytest.approx(0.2)
        assert fidelity.fidelity("debug", ran_compiled=False)["cases"] == 0
        assert fidelity.band_text("debug", 0, None, None) == "no band (debug)"
        assert fidelity.band_text("fused", 2, 0.05, 0.07) == "±5.0% (max 7.0%, 2 fused cases)"
    finally:
        calibration.error_bands.cache_clear()


def test_both_compilers_price_each_training_case_side_by_side() -> None:
    from tpusim.validate.product import with_compiler

    chosen = [c for c in CASES if c.name.startswith("titan-") or c.path != "product"][:12]
    both = with_compiler(chosen, "both")
    training = [c for c in chosen if c.name.startswith("titan-")]
    assert [c.name for c in both if c.name.endswith("@xla")] == [f"{c.name}@xla" for c in training]
    assert all(c.compiler == "xla" and c.slow for c in both if c.name.endswith("@xla"))
    assert with_compiler(chosen, "model") == chosen
    assert {c.name for c in with_compiler(chosen, "xla")} == {
        *(c.name for c in chosen if c not in training), *(f"{c.name}@xla" for c in training)}


@pytest.mark.slow      # about a minute: a small recording, then XLA compiles its programs (deviceless)
def test_the_compiler_path_prices_a_case_from_xlas_programs(tmp_path, monkeypatch) -> None:
    pytest.importorskip("jax")
    from tpusim.xla.compiler import missing

    if missing():
        pytest.skip(missing())
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    recording.cache_clear()
    base = next(r for r in RUNS if r.mode == "compile" and r.accelerator == "v6e-8")
    small = ("--layers", "2", "--kv-reuse", "1", "--d-model", "256", "--heads", "4", "--kv-heads", "2",
             "--vocab", "2048", "--seq", "256", "--loss-chunk", "128", "--batch", "1", "--steps", "3")
    model_run = dataclasses.replace(base, name="titan-test-model", args=small)
    xla_run = dataclasses.replace(model_run, name="titan-test-xla", compiler="xla")
    trace, report = recording(xla_run)
    assert trace.meta.xla_modules                                       # the compiled layers' programs
    xla_s = case(xla_run).predict(chip_for(case(xla_run))).seconds
    # what `tpusim run --compiler xla` printed for the same recording: the same path
    assert xla_s == pytest.approx(report["modes"]["fused"]["step_time_median_s"], rel=1e-9)
    assert report["modes"]["fused"]["compiler"] == "xla"
