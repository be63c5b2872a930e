"""Inference programs (issue 30): prefill and decode told apart (marked or from the attention shapes), and the
report's serving numbers checked against closed forms: KV bytes per token = 2 x layers x kv_heads x head_dim x dtype
bytes, the HBM roofline = (weights + KV cache) / HBM bandwidth, tokens/s = batch x decode steps / decode time."""

import dataclasses
import itertools
import json
import math
import subprocess
import sys
from pathlib import Path
from statistics import median

import factories
import html5lib
import pytest
from factories import training_trace

from tpusim.eager.modes import get_mode
from tpusim.errors import TpusimError
from tpusim.hardware.spec import load_chip
from tpusim.pricing import price
from tpusim.report import RunInfo, build_report, summary_table
from tpusim.report.html import render_html
from tpusim.report.inference import find_phases
from tpusim.report.text import seconds_text
from tpusim.slice.topology import build_slice
from tpusim.trace.records import PHASE_REASON, HostRecord, OpRecord, TensorMeta, Trace, renumber

STRICT = get_mode("strict")

LAYERS, BATCH, HEADS, HEAD_DIM, CONTEXT, PROMPT, STEPS, DIM = 2, 4, 8, 128, 512, 16, 8, 8192
BF16 = 2
SCRIPT = Path(__file__).parent / "scripts" / "decode_loop.py"
_STORAGES = itertools.count(1000, 4)


def _t(storage: int, shape: tuple[int, ...]) -> TensorMeta:
    return TensorMeta(storage, shape, "bfloat16", math.prod(shape) * BF16, storage)


def decode_trace(marked: bool = False) -> Trace:
    """A prefill of PROMPT tokens, then STEPS decode steps over a static bf16 KV cache of CONTEXT tokens."""
    return factories.decode_trace(layers=LAYERS, batch=BATCH, heads=HEADS, head_dim=HEAD_DIM, dim=DIM,
                                  context=CONTEXT, prompt=PROMPT, steps=STEPS, marked=marked)


@pytest.mark.parametrize("marked", [False, True])
def test_prefill_and_decode_steps_are_found_marked_or_from_the_attention_shapes(marked):
    phases = find_phases(decode_trace(marked))
    assert phases is not None and phases.found_by == ("marked" if marked else "detected")
    assert len(phases.decode) == STEPS and phases.batch == BATCH and phases.prompt_tokens == PROMPT
    ops_per_forward = 3 * LAYERS
    for start, end in phases.decode:          # each step one whole forward pass: its ops and nothing else
        assert sum(1 for r in decode_trace(marked).records if isinstance(r, OpRecord) and start <= r.seq < end) \
            == ops_per_forward
    assert phases.prefill is not None and phases.prefill[1] <= phases.decode[0][0]


def grown_cache_trace() -> Trace:
    """generate() with a dynamic cache as it reaches "tpu": attention as matmuls over K/V that a cat grows by one token
    a step, and the tokens cat'ed at the end of every step (prefill included)."""
    weight, records, past = _t(100, (DIM, DIM)), [], [None] * (2 * LAYERS)
    for step in range(STEPS + 1):
        tokens, length = (PROMPT, 0) if step == 0 else (1, PROMPT + step - 1)
        fresh = next(_STORAGES)
        x, y = _t(fresh, (BATCH * tokens, DIM)), _t(fresh + 1, (BATCH * tokens, DIM))
        records.append(OpRecord(0, "aten::mm", "mxu", "bfloat16", (x, weight), (y,),
                                flops=2 * BATCH * tokens * DIM * DIM, bytes_read=x.nbytes + weight.nbytes,
                                bytes_written=y.nbytes, source="model.py:10"))
        for i in range(2 * LAYERS):                             # K and V of each layer
            new = _t(next(_STORAGES), (BATCH, HEADS, tokens, HEAD_DIM))
            if past[i] is not None:
                grown = _t(next(_STORAGES), (BATCH, HEADS, length + 1, HEAD_DIM))
                records.append(OpRecord(0, "aten::cat", "vpu", "bfloat16", (past[i], new), (grown,),
                                        bytes_read=past[i].nbytes + new.nbytes, bytes_written=grown.nbytes,
                                        source="model.py:11"))
                new = grown
            records.append(OpRecord(0, "aten::bmm", "mxu", "bfloat16", (y, new), (x,), flops=2.0,
                                    bytes_read=new.nbytes, source="model.py:12"))
            past[i] = new
        ids = _t(next(_STORAGES), (BATCH, PROMPT + step))
        records.append(OpRecord(0, "aten::cat", "vpu", "int64", (ids, _t(next(_STORAGES), (BATCH, 1))),
                                (_t(next(_STORAGES), (BATCH, PROMPT + step + 1)),), source="generate.py:9"))
    return Trace(renumber(records))


def test_a_cache_grown_by_cat_behind_matmul_attention_is_found_by_its_growth():
    from tpusim.report.inference import footprint

    trace = grown_cache_trace()
    phases = find_phases(trace)
    assert phases is not None and phases.found_by == "detected" and len(phases.decode) == STEPS
    assert phases.prompt_tokens is None and phases.prefill is not None
    fp = footprint(trace.records, phases)
    assert fp.kv_bytes_per_token == 2 * LAYERS * HEADS * HEAD_DIM * BF16 and fp.kv_context == PROMPT + STEPS
    assert not fp.kv_persistent and fp.kv_tensors == 2 * LAYERS and fp.weights_bytes == DIM * DIM * BF16


@pytest.fixture(scope="module")
def inference_report():
    slice_ = build_slice("3d:1x1x1", "v5p")
    trace = decode_trace()
    return build_report(RunInfo("serve.py"), trace, slice_, {"strict": price(trace, topology=slice_, mode=STRICT)})


@pytest.mark.parametrize("kv_dtype, item", [("int8", 1), ("float8_e4m3fn", 1)])
def test_a_quantised_kv_cache_counts_its_own_bytes_and_fits_twice_the_batch(kv_dtype, item):
    """An int8 or fp8 KV cache: a byte an element in the closed form, so the largest batch at the context is
    the bf16 cache's doubled (to within the one sequence floor division drops)."""
    slice_ = build_slice("3d:1x1x1", "v5p")
    sections = {}
    for dtype in ("bfloat16", kv_dtype):
        trace = factories.decode_trace(layers=LAYERS, batch=BATCH, heads=HEADS, head_dim=HEAD_DIM, dim=DIM,
                                       context=CONTEXT, prompt=PROMPT, steps=STEPS, kv_dtype=dtype)
        sections[dtype] = build_report(RunInfo("serve.py"), trace, slice_,
                                       {"strict": price(trace, topology=slice_, mode=get_mode("strict"))}).inference
    quantised, full = sections[kv_dtype], sections["bfloat16"]
    assert quantised.kv_cache.bytes_per_token == 2 * LAYERS * HEADS * HEAD_DIM * item
    assert quantised.kv_cache.dtype == kv_dtype and quantised.weights_bytes == full.weights_bytes
    free = slice_.chip.hbm_bytes - full.weights_bytes
    assert quantised.fits.max_batch_at_context == free // (2 * LAYERS * HEADS * HEAD_DIM * item * CONTEXT)
    assert quantised.fits.max_batch_at_context in (2 * full.fits.max_batch_at_context,
                                                   2 * full.fits.max_batch_at_context + 1)


def test_kv_cache_weights_and_what_fits_follow_the_closed_forms(inference_report):
    section, chip = inference_report.inference, inference_report.chip
    per_token = 2 * LAYERS * HEADS * HEAD_DIM * BF16
    kv = section.kv_cache
    assert kv.bytes_per_token == per_token and kv.context == CONTEXT and kv.static and kv.tensors == 2 * LAYERS
    assert kv.bytes == per_token * BATCH * CONTEXT and kv.bytes_per_sequence == per_token * CONTEXT
    assert section.weights_bytes == LAYERS * DIM * DIM * BF16
    fits = section.fits
    assert fits.fits and fits.max_batch_at_context == (chip.hbm_bytes - section.weights_bytes) // (per_token * CONTEXT)
    assert f"batch {BATCH} at context {CONTEXT} fits" in fits.line
    assert f"at context {CONTEXT} the largest batch is {fits.max_batch_at_context}" in fits.line


def test_what_fits_is_measured_against_the_hbm_the_run_was_configured_with():
    # issue 44, IN1: a decode loop run with TPUSIM_HBM_BYTES=64000000 ran out of memory, and its report said the
    # batch "fits (40.2 MiB of 95 GiB HBM per chip)": the datasheet's HBM, not the capacity the run died on
    from tpusim.trace.records import TraceMeta

    slice_ = build_slice("3d:1x1x1", "v5p")
    base = decode_trace()
    per_token = 2 * LAYERS * HEADS * HEAD_DIM * BF16
    needed = LAYERS * DIM * DIM * BF16 + BATCH * CONTEXT * per_token
    small = needed - 1                                           # one byte short, per device (v5p: one per chip)
    sections = {}
    for name, meta in (("configured", TraceMeta(chip="v5p", hbm_bytes=small)),
                       ("other chip", TraceMeta(chip="v6e", hbm_bytes=small)),   # recorded elsewhere: datasheet's
                       ("datasheet", TraceMeta(chip="v5p", hbm_bytes=slice_.chip.hbm_bytes))):
        trace = dataclasses.replace(base, meta=meta)
        sections[name] = build_report(RunInfo("serve.py"), trace, slice_,
                                      {"strict": price(trace, topology=slice_, mode=get_mode("strict"))}).inference.fits
    configured = sections["configured"]
    assert configured.fits is False and configured.hbm_bytes == small and configured.max_batch_at_context == BATCH - 1
    assert "does not fit" in configured.line and "(the run's TPUSIM_HBM_BYTES)" in configured.line
    for name in ("other chip", "datasheet"):
        assert sections[name].fits and sections[name].hbm_bytes == slice_.chip.hbm_bytes


def test_ttft_tpot_tokens_per_second_and_the_hbm_bound(inference_report):
    mode = inference_report.inference.modes["strict"]
    chip = inference_report.chip
    assert len(mode.decode_steps_s) == STEPS and mode.ttft_s > 0
    assert mode.tpot_median_s == pytest.approx(median(mode.decode_steps_s))
    assert mode.tpot_median_s <= mode.tpot_p90_s <= max(mode.decode_steps_s)
    assert mode.decode_s == pytest.approx(sum(mode.decode_steps_s), rel=1e-6)
    steady = mode.decode_steps_s[1:]                       # after the first step, which compiles
    assert mode.tokens_per_s_per_chip == pytest.approx(BATCH * (STEPS - 1) / sum(steady), rel=1e-6)
    weights_and_cache = LAYERS * DIM * DIM * BF16 + 2 * LAYERS * HEADS * HEAD_DIM * BF16 * BATCH * CONTEXT
    assert mode.roofline_step_s == pytest.approx(weights_and_cache / chip.hbm_bytes_per_s)
    assert mode.roofline_ratio >= 1 and mode.roofline_ratio == pytest.approx(mode.tpot_median_s / mode.roofline_step_s)
    assert mode.decode.bound == "HBM" and mode.decode.hbm_utilisation > 0.5       # a matvec over 256 MiB of weights
    assert mode.verdict.startswith("decode HBM-bound") and "x the HBM roofline" in mode.verdict


def test_the_summary_and_page_speak_of_phases_not_missing_steps(inference_report):
    table = summary_table(inference_report, "out")
    assert "no steps marked" not in table
    assert f"prefill and {STEPS} decode steps of batch {BATCH} (detected)" in table.splitlines()[0]
    for label in ("TTFT (prefill)", f"TPOT median ({STEPS} steps)", "TPOT p90", "tokens/s per chip", "KV cache:",
                  "fits: batch", "inference (strict): TTFT ", ": decode HBM-bound"):
        assert label in table
    page = render_html(inference_report, {})
    assert "<h2>Inference</h2>" in page and "TPOT median" in page
    html5lib.HTMLParser(strict=True).parse(page)          # raises on any parse error


def test_a_training_program_has_no_inference_section():
    slice_ = build_slice("3d:1x1x1", "v5p")
    trace = training_trace()
    report = build_report(RunInfo("train.py"), trace, slice_, {"strict": price(trace, topology=slice_)})
    assert report.inference is None and "TTFT" not in summary_table(report, "out")
    assert json.loads(json.dumps(report.to_dict()))["inference"] is None


def test_the_phase_marker_records_zero_second_dispatches_and_refuses_other_names():
    import torch

    import tpusim.backend as tb

    with pytest.raises(TpusimError, match="prefill, decode"):
        with tb.phase("generate"):
            pass
    with tb.recording() as rec:
        with tb.phase("decode"):
            torch.ones(2, device="tpu").add_(1)
    marks = [r.reason for r in rec.trace.records if isinstance(r, HostRecord) and r.reason.startswith(PHASE_REASON)]
    assert marks == ["phase:decode", "phase:end"]


@pytest.mark.slow
def test_a_toy_decode_loop_run_by_tpusim_reports_its_phases(tmp_path):
    """The product path: a 2-layer model with a static KV cache, 16 prompt tokens, 8 decode steps, nothing marked."""
    done = subprocess.run([sys.executable, "-m", "tpusim", "run", "--compiler", "model", "--numerics", "off",
                           "--out", str(tmp_path), str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    section = json.loads((tmp_path / "report.json").read_text())["inference"]
    assert section["phases_from"] == "detected" and section["decode_steps"] == 8
    assert section["batch"] == 2 and section["prompt_tokens"] == 16
    assert section["kv_cache"]["bytes_per_token"] == 2 * 2 * 4 * 32 * 4         # layers, kv heads, head dim, f32
    mode = section["modes"]["strict"]
    assert mode["tpot_median_s"] > 0 and mode["ttft_s"] > 0
    assert mode["tokens_per_s_per_chip"] == pytest.approx(2 * 7 / sum(mode["decode_steps_s"][1:]), rel=1e-6)
    assert mode["decode"]["bound"] and mode["verdict"].startswith(f"decode {mode['decode']['bound']}-bound")
    assert "prefill and 8 decode steps" in done.stdout


def _tensor_parallel(dim: int):
    """The decode loop, each layer's projection all-reduced (batch x dim bf16) over the 4 chips of 2d:2x2 v6e."""
    trace = factories.decode_trace(layers=LAYERS, batch=BATCH, heads=HEADS, head_dim=HEAD_DIM, dim=dim,
                                   context=CONTEXT, prompt=PROMPT, steps=STEPS, marked=True, tp=4)
    slice_ = build_slice("2d:2x2", "v6e")
    timeline = price(trace, topology=slice_, mode=get_mode("strict"))
    report = build_report(RunInfo("serve.py"), trace, slice_, {"strict": timeline})
    return report, timeline, find_phases(trace)


@pytest.mark.parametrize("dim", [64, 262144])
def test_tensor_parallel_decode_shows_its_exposed_collectives_and_their_latency_share(dim):
    report, timeline, phases = _tensor_parallel(dim)
    mode = report.inference.modes["strict"]
    chip = timeline.chips_simulated[0]
    # independent of the report: step ends from the device events, the steady steps (after the first) exposed waits
    ends = [max(e.end_s for e in timeline.events if e.chip == chip and a <= e.seq < b and e.kind != "host")
            for a, b in phases.decode]
    tpot = median(b - a for a, b in zip(ends, ends[1:]))
    waits = sum(min(e.end_s, ends[-1]) - max(e.start_s, ends[0]) for e in timeline.events
                if e.chip == chip and e.kind == "wait" and e.bound == "collective" and e.end_s > ends[0]
                and e.start_s < ends[-1]) / (STEPS - 1)
    assert mode.decode_collective_s > 0 and mode.decode_collective_s == pytest.approx(waits)
    assert mode.decode_collective_share == pytest.approx(waits / tpot, rel=0.05)
    runs = [c for c in timeline.collectives if c.chip == chip and phases.decode[1][0] <= c.seq]
    assert len(runs) == LAYERS * (STEPS - 1)
    # closed form: latency term / (latency + bytes / bandwidth), the DES agreeing with it on an idle network
    alpha = sum(c.result.latency_s for c in runs)
    assert mode.decode_collective_latency_share == pytest.approx(alpha / sum(c.result.closed_form_s for c in runs),
                                                                 rel=0.05)
    v6e = load_chip("v6e")              # at least the start-up overhead and one hop's latency
    assert all(c.result.latency_s >= (v6e.collective_overhead_ns + v6e.ici_hop_latency_ns) * 1e-9 for c in runs)
    lines = summary_table(report, "out")
    assert "decode collectives:" in lines
    if dim == 64:       # 512 B all-reduces: latency-bound
        assert mode.decode_collective_latency_share > 0.9 and "latency-bound" in lines
    else:               # 2 MiB: the bytes take most of it
        assert mode.decode_collective_latency_share < 0.5 and "bandwidth-bound" in lines


def test_a_decode_loop_without_collectives_reports_none_for_them(inference_report):
    mode = inference_report.inference.modes["strict"]
    assert mode.decode_collective_s is None and mode.decode_collective_share is None
    assert mode.decode_collective_latency_share is None
    assert "decode collectives" not in summary_table(inference_report, "out")


def test_a_decode_loop_that_compiles_every_step_says_why_how_often_and_the_fix_in_every_mode():
    """Issue 45: "decode compile-bound" beside "recompiles 0" named no cause. A cache grown by cat gives every token
    step new shapes: in Strict a program compiles once per signature, so each step compiles one K/V cat (all 2 x LAYERS
    share a shape), one bmm and the tokens' cat anew (the projection's shape repeats: a hit): 3; a static cache
    compiles nothing after its first step."""
    slice_ = build_slice("3d:1x1x1", "v5p")
    trace = grown_cache_trace()
    timelines = {mode: price(trace, topology=slice_, mode=get_mode(mode)) for mode in ("strict", "fused")}
    report = build_report(RunInfo("generate.py"), trace, slice_, timelines)
    strict, fused = report.inference.modes["strict"], report.inference.modes["fused"]
    assert strict.decode_compiles_per_step == 3
    for mode in (strict, fused):
        assert mode.decode_compiles_per_step >= 1
        assert "programs anew: new shapes each step (cat at generate.py:9 reads an input one longer along dim 1" \
            in mode.verdict
        assert "Fix: a static KV cache (preallocated, written in place) and the decode step under torch.compile" \
            in mode.verdict
    table = summary_table(report, "out").splitlines()
    recompiles = next(line for line in table if line.startswith("recompiles"))
    assert "0 (decode: 3/step)" in recompiles
    assert next(line for line in table if line.startswith("decode compiles/step")).split()[-2] == "3"
    verdicts = [line for line in table if line.startswith(("inference (", "verdict ("))]
    assert verdicts[0].startswith(f"inference (strict): TTFT {seconds_text(strict.ttft_s)}, TPOT "
                                  f"{seconds_text(strict.tpot_median_s)}: decode ")
    assert not any("no steps marked" in line for line in verdicts)
    page = render_html(report, {})
    assert "<div class='card'>TTFT (prefill)<b>" in page and "step time (steady median)" not in page
    verdict = page.split("<p class='verdict'>")[1].split("</p>")[0]
    assert f"TTFT {seconds_text(strict.ttft_s)}" in verdict or f"TTFT {seconds_text(fused.ttft_s)}" in verdict
    static = build_report(RunInfo("serve.py"), decode_trace(), slice_,
                          {"strict": price(decode_trace(), topology=slice_, mode=STRICT)}).inference.modes["strict"]
    assert static.decode_compiles_per_step == 0 and "Fix:" not in static.verdict


def test_a_cache_sliced_to_the_tokens_so_far_is_named_as_the_cause():
    """Issue 45: attention over ``K[..., :pos]`` (a cache sliced, not grown by cat) has a query of fixed shape and a
    K/V one token longer each step: the cause names that attention call and its line."""
    from tpusim.report.inference import shape_cause

    q = _t(1, (BATCH, HEADS, 1, HEAD_DIM))
    kv = [(_t(2, (BATCH, HEADS, PROMPT + step, HEAD_DIM)), _t(3, (BATCH, HEADS, PROMPT + step, HEAD_DIM)))
          for step in range(5)]
    records = [OpRecord(0, "aten::_scaled_dot_product_fused_attention_overrideable", "mxu", "bfloat16", (q, k, v),
                        (q,), source="decode.py:14") for k, v in kv]
    assert shape_cause(renumber(records)) == ("_scaled_dot_product_fused_attention_overrideable at decode.py:14 reads "
                                              "a K one longer along dim 2 each step")
    fixed = [dataclasses.replace(r, inputs=(q, q, q)) for r in records]
    assert shape_cause(renumber(fixed)) == ""
