"""`tpusim validate`'s inference cases: validation/decode.py recorded by `tpusim run`, its time per token priced.

The truths: the script on "tpu" gives the CPU's tokens; a case predicts the decode steps `tpusim run` printed in
report.json's inference section (the same recording, calibrated chip, Fused mode); and a priced decode step reads
at least the closed form of a token step's HBM traffic: every weight and the whole KV cache once.
"""

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path
from statistics import median

import pytest

from tpusim.hardware.spec import load_chip
from tpusim.trace.records import OpRecord
from tpusim.validate import CASES
from tpusim.validate.inference import ANALYTIC, MEASURED, case, token_step_seconds
from tpusim.validate.product import VALIDATION, recording
from tpusim.validate.suite import chip_for

SMALL = ("--layers", "2", "--d-model", "512", "--heads", "8", "--kv-heads", "2", "--head-dim", "64",
         "--mlp-dim", "1536", "--vocab", "4096", "--batch", "8", "--context", "256", "--steps", "4")


def _small(*extra: str):
    """The 70B serving case's shape of run, small: 2 layers on v5e 2d:1x2, tensor parallel 2."""
    return dataclasses.replace(ANALYTIC[0], name="decode-test-small", topology="2d:1x2", args=(*SMALL, *extra))


@pytest.mark.slow
def test_the_decode_script_gives_the_cpus_tokens_on_tpu():
    script, flags = str(VALIDATION / "decode.py"), ("--int8", "--kv-int8", "--chunk", "8")
    runs = ([sys.executable, "-m", "tpusim", "run", script, "--compiler", "model", "--quiet", "--", *flags],
            [sys.executable, script, "--device", "cpu", *flags])
    outputs = [subprocess.run(command, capture_output=True, text=True, timeout=300, check=True).stdout
               for command in runs]
    on_tpu, on_cpu = (next(line for line in out.splitlines() if line.startswith("tokens:")) for out in outputs)
    assert on_tpu == on_cpu


def test_an_inference_case_predicts_the_decode_steps_tpusim_run_printed(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))      # recorded now, with the calibration of now
    recording.cache_clear()
    run = _small("--int8", "--kv-int8")
    trace, report = recording(run)
    c = case(run, "measured")
    chip = chip_for(c, True)
    predicted = c.predict(chip).seconds
    printed = report["inference"]["modes"]["fused"]
    assert report["inference"]["phases_from"] == "marked" and len(printed["decode_steps_s"]) == 4
    assert math.isclose(predicted, median(printed["decode_steps_s"][1:]), rel_tol=1e-6)   # report.json: 12 digits
    assert trace.meta.torch_compile.graphs >= 2                        # the prefill and the decode step
    # a token step reads every weight (int8, one byte each, this chip's half) and the whole KV cache (int8 and a
    # bf16 scale per token and head) at least once: the closed-form roofline is a floor under the priced step
    layers, d, q, kv, mlp, vocab, batch, length, tp = 2, 512, 8 * 64, 2 * 64, 1536, 4096, 8, 256 + 4, 2
    weights = (layers * (d * (q + 2 * kv) + q * d + 3 * d * mlp) + vocab * d) / tp
    cache = layers * 2 * batch * (kv // tp) * length * (1 + 2 / 64)
    assert predicted >= (weights + cache) / chip.hbm_bytes_per_s
    # the report's footprint: int8 weights (with their bf16 scales, norms and embedding shard) and an int8 cache;
    # a scale per output channel: the column-parallel projections' are sharded, the row-parallel ones' (d) are not
    scales = layers * ((q + 2 * kv + 2 * mlp) / tp + 2 * d) + vocab / tp
    bf16 = layers * 2 * d + d + vocab / tp * d
    section = report["inference"]
    assert section["weights_bytes"] == weights + 2 * (scales + bf16)
    assert section["kv_cache"]["dtype"] == "int8" and section["kv_cache"]["context"] == length
    assert section["batch"] == batch          # decode attention written as matmuls: the batch is the cache's
    # an analytic case (a source's roofline) is priced as the recording's roofline: those weights and the int8 cache
    int8_cache = layers * 2 * batch * (kv // tp) * length
    roofline = case(run, "analytic").predict(chip)
    assert roofline.seconds == pytest.approx((weights + 2 * (scales + bf16) + int8_cache) / chip.hbm_bytes_per_s)
    assert f"priced decode step {predicted * 1e3:.2f} ms" in roofline.notes[-1]
    # the cache's write-back after each compiled step moves nothing: XLA updates the donated buffer in place
    cache_storages = {r.outputs[0].storage for r in trace.records if isinstance(r, OpRecord) and r.op == "aten::copy_"
                      and len(r.outputs[0].shape) == 4}
    assert cache_storages and all(r.bytes_written == 0 for r in trace.records if isinstance(r, OpRecord)
                                  and r.op == "aten::copy_" and r.outputs[0].storage in cache_storages)


@pytest.mark.slow
def test_a_decode_step_with_a_prefill_chunk_costs_more_than_without(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    recording.cache_clear()
    chip = load_chip("v5e")
    wide = ("--d-model", "8192", "--heads", "64", "--kv-heads", "8", "--head-dim", "128", "--mlp-dim", "28672")
    plain, chunked = (token_step_seconds(_small(*wide, *extra), chip)[0] for extra in ((), ("--chunk", "512")))
    assert chunked > 1.2 * plain          # 512 more rows through every weight: MXU work the 8 rows of decode lack


def test_inference_cases_name_their_sources_and_kinds_and_never_the_held_out_rows():
    names = {c.name for c in CASES}
    for run in (*MEASURED, *ANALYTIC):
        assert run.name in names and run.script == "decode.py" and run.published_s > 0 and run.where
        assert "Ironwood" not in run.where and "tpu7x" not in run.where and "v7" not in run.accelerator
    kinds = {c.name: c.kind for c in CASES}
    assert {kinds[r.name] for r in MEASURED} == {"measured"} and {kinds[r.name] for r in ANALYTIC} == {"analytic"}
    # the vLLM case's chunk: output tokens/s / 1000 outputs x 999 prompt tokens / steps per second
    c64 = next(r for r in MEASURED if r.name.endswith("c64"))
    assert c64.args[c64.args.index("--chunk") + 1] == str(round(2494.80 / 1000 * 999 * 0.02535))
    assert Path(VALIDATION / "decode.py").is_file()


def test_a_kv_cache_that_does_not_fit_stops_at_the_line_that_allocates_it(tmp_path):
    """16 layers of an 8B-class model (weights about 7 GiB in bf16) with 64 sequences of 16k tokens: the cache
    (64 x 16388 x 16 layers x 2 x 8 heads x 128 x 2 B = 64 GiB) cannot fit v5e's 16 GiB beside the weights."""
    done = subprocess.run(
        [sys.executable, "-m", "tpusim", "run", str(VALIDATION / "decode.py"), "--chip", "v5e", "--numerics", "off",
         "--compiler", "model", "--quiet", "--out", str(tmp_path), "--", "--layers", "16", "--d-model", "4096",
         "--heads", "32", "--kv-heads", "8", "--head-dim", "128", "--mlp-dim", "14336", "--vocab", "32000",
         "--batch", "64", "--context", "16384"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["error"]["type"] == "OutOfMemoryError" and not report["complete"]
    assert "TPU out of memory" in done.stderr and "model.to_empty(device=args.device)" in done.stderr
