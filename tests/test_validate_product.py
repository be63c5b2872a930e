"""`tpusim validate`'s product-path cases: a PyTorch script recorded by `tpusim run`, then priced.

The truths: the number a case predicts is the step time `tpusim run` printed for the same script (report.json,
calibrated chip, Fused mode); the recording compiled the blocks (Dynamo graphs, attention as one fused op);
and the recorded matmul work is at least the closed form of a decoder's training step, 6 x parameters x tokens
(the script's checkpointing only adds to it).
"""

import dataclasses
import json
import math

import pytest

from tpusim.cli.main import main
from tpusim.trace.records import OpRecord, StepMarker
from tpusim.validate import find_case, run_case
from tpusim.validate.product import PRODUCT_RUNS, ProductRun, case, recording
from tpusim.validate.suite import chip_for

FAST_PRODUCT = next(c for c in (case(r) for r in PRODUCT_RUNS) if not c.slow)


def _small() -> ProductRun:
    """A small decoder on four v5e chips: 2 layers, d_model 512, grouped-query attention, tensor parallel 2."""
    base = next(r for r in PRODUCT_RUNS if r.chip == "v5e")
    args = ("--layers", "2", "--d-model", "512", "--heads", "8", "--kv-heads", "2", "--head-dim", "64",
            "--mlp-dim", "1536", "--vocab", "4096", "--seq", "256", "--batch", "2", "--tp", "2", "--remat", "none")
    return dataclasses.replace(base, name="product-test-small", topology="2d:2x2", args=args)


def test_a_product_case_predicts_what_tpusim_run_printed_and_compiled_its_blocks(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))      # recorded now, with the calibration of now
    recording.cache_clear()
    run = _small()
    trace, report = recording(run)
    c = case(run)
    predicted = c.predict(chip_for(c, True)).seconds
    printed = report["modes"]["fused"]["step_time_median_s"]
    assert math.isclose(predicted, printed, rel_tol=1e-9)
    assert report["chip"]["calibration"].endswith("calibration/v5e.toml")
    assert trace.meta.torch_compile.graphs >= 1
    ops = [r for r in trace.records if isinstance(r, OpRecord) and r.rank == 0]
    assert any(op.op == "tpusim::attention" for op in ops)          # flash attention, grouped-query included
    # the matmul work of one training step on one chip: 6 x (matmul) parameters x tokens, at least; a
    # tensor-parallel pair works on batch x 2 sequences and splits every matmul in two
    layers, d, q, kv, mlp, vocab, seq, batch = 2, 512, 8 * 64, 2 * 64, 1536, 4096, 256, 2
    params = layers * (d * (q + 2 * kv) + q * d + 3 * d * mlp) + vocab * d
    steps = sum(1 for r in trace.records if isinstance(r, StepMarker) and r.rank == 0)
    matmul = sum(op.flops for op in ops if op.family == "contraction") / steps
    assert steps == 2 and matmul >= 0.99 * 6 * params * batch * seq


def test_the_fast_product_case_stays_on_its_published_step(tmp_path):
    """The fidelity gate of the default suite: the Mistral 7B recipe on v6e-8 (6.320 s per step, published), which
    v6e's mxu_efficiency was fitted on, priced through `tpusim run`'s path. A change to how tpusim records or
    prices a training step moves it: the second step's optimizer compiles once did, by 9.4%, unnoticed."""
    result = run_case(FAST_PRODUCT)
    assert abs(result.error) < 0.03, f"{FAST_PRODUCT.name}: {result.error:+.1%} off its published step"
    out = tmp_path / "v.json"
    assert main(["validate", "--case", FAST_PRODUCT.name, "--json", str(out), "--quiet"]) == 0
    row = json.loads(out.read_text())["results"][0]
    assert row["mode"] == "compile" and row["script"] == "validation/decoder.py" and row["chips"] == 8
    assert {"name", "chip", "chips", "published_s", "predicted_s", "error", "held_out", "fitted_on"} <= row.keys()


def test_product_cases_name_their_sources_and_never_the_held_out_runs():
    held_out = ("Llama3.1-8B-MaxText", "GPT3-175B-MaxText/bf16", "Llama3.1-405B-MaxText", "training/v5p/GPT3-175B")
    for run in PRODUCT_RUNS:
        assert run.source.startswith("https://github.com/") and run.where and run.published_s > 0
        assert not any(h in run.where for h in held_out), run.name
    assert find_case([case(r) for r in PRODUCT_RUNS], "product-recipes-mistral-7b-v6e-8")


def test_a_multislice_row_records_over_its_slices_with_the_scripts_dcn_dim(tmp_path):
    from tpusim.validate.maxtext import RUNS
    from tpusim.validate.product import command
    from tpusim.validate.suite import case_chips

    row = next(r for r in RUNS if r.name == "maxtext-v5e-32b-2xv5e-256")
    run = next(r for r in PRODUCT_RUNS if r.twin == row.name)
    argv = command(run, tmp_path)
    assert argv[argv.index("--slices") + 1] == "2" and argv[argv.index("--dcn") + 1] == "2"
    assert case_chips(case(run)) == 512 and run.published_s == pytest.approx(row.published_step_s())
    assert not any(r.slices > 4 for r in PRODUCT_RUNS)       # the 8- to 32-slice rows stay closed-form
