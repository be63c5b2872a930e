"""Inference cases through the product path: a published time per output token, priced from a PyTorch decode loop.

Why: serving engineers act on the time per output token (TPOT) `tpusim run serve.py` prints, so that is what is
checked. Each case runs ``validation/decode.py`` (a Llama-style decoder, tensor parallel by hand over the slice, a
static KV cache, the prefill and the decode step each ``torch.compile``'d and marked with ``tpusim.backend.phase``)
at the published model, batch, context, precision and slice, recorded by `tpusim run` exactly as the training cases
are (tpusim/validate/product.py: a process of its own, ``--numerics off``, kept in tpusim's cache per source
digest), and prices it with ``tpusim.pricing.price``. A measured case predicts the median decode step after the first
(the first compiles what the loop runs), read off the timeline by the report's own rule (tpusim/pricing/tokens.py).
An analytic case's figure is its source's roofline (bytes / HBM bandwidth), so it is compared with the recording's
roofline (the weights and KV cache a chip holds, as the report counts them, read once), like with like: it checks
the script and what tpusim counts, not the chip; the priced step stands beside it (``--explain``).

Sources (``../shared/research``-style rows; each run's ``where`` quotes the line):
- **measured**: AI-Hypercomputer/tpu-recipes' vLLM recipe for Llama 3.3 70B on Trillium (v6e-8, tensor parallel 8,
  bf16 weights and KV cache): ``vllm bench serve`` with 1000-token prompts, 1000 output tokens and a stated
  concurrency, so the decode batch is the concurrency and a sequence's context runs from 1000 to 1999 tokens (the
  script decodes at the middle, 1500). vLLM's mean TPOT is (end-to-end - TTFT) / (outputs - 1) per request: one
  decode step's wall time, including the chunked prefill of the prompts that arrive meanwhile; the script carries
  that many prompt tokens in each step (``--chunk``: output tokens/s x 999 prompt tokens / steps per second).
- **analytic**: the JAX scaling book's worked serving examples on 8 v5e chips (LLaMA 3 70B with int8 weights and KV
  cache at batch 32 and context 8192; LLaMA 2 13B in bf16 at context 8192, batch 1 and 16 of its table): the book's
  pen-and-paper roofline ((params + KV cache) bytes / the slice's HBM bandwidth), kept as formula checks and never
  mixed into the fidelity error.

Not used, with why: jetstream-pytorch's v5e-8 throughput table (its figures include the prefills of a ShareGPT run
with unknown slot occupancy: batch / throughput bounds a step from above, it does not measure one); MLPerf Inference
GPT-J on v5e-4 (beam search over bucketed, variable-length samples: no per-step time); the Qwen3.6 27B recipe (a
hybrid linear-attention model with prefix caching and unstated output lengths); MaxText's inference microbenchmark
configs (no published results).
"""

from __future__ import annotations

from statistics import median

from tpusim.hardware.spec import ChipSpec
from tpusim.validate.case import Case, Prediction
from tpusim.validate.fit import SERVING_SCRIPT
from tpusim.validate.product import ProductRun, recording

VLLM_RECIPE = "inference/trillium/vLLM/Llama3.x/README.md"
VLLM_COMMIT = "b709d7342e6302a84337245770bee81e9d2a08fe"
SCALING_BOOK = "https://jax-ml.github.io/scaling-book/"      # + the chapter: inference/, applied-inference/
SCALING_BOOK_COMMIT = "0819a7d8c55ddc113f5cba0285a5f97380cac1e3"
DECODE_STEPS = 4                 # the script's decode steps: the first compiles, the median of the other three counts

# Llama 3 / 3.1 / 3.3 70B (one architecture): meta-llama's config.json
_LLAMA3_70B = ("--layers", "80", "--d-model", "8192", "--heads", "64", "--kv-heads", "8", "--head-dim", "128",
               "--mlp-dim", "28672", "--vocab", "128256")
# LLaMA 2 13B (the scaling book's inference chapter uses its config; multi-head attention: 40 K/V heads)
_LLAMA2_13B = ("--layers", "40", "--d-model", "5120", "--heads", "40", "--kv-heads", "40", "--head-dim", "128",
               "--mlp-dim", "13824", "--vocab", "32000")


def _args(model: tuple[str, ...], batch: int, context: int, *, chunk: int = 0, int8: bool = False) -> tuple[str, ...]:
    extra = (("--chunk", str(chunk)) if chunk else ()) + (("--int8", "--kv-int8") if int8 else ())
    return (*model, "--batch", str(batch), "--context", str(context), "--steps", str(DECODE_STEPS), *extra)


def _vllm(concurrency: int, tpot_ms: float, tokens_per_s: float, lines: str) -> ProductRun:
    """One concurrency of the vLLM Llama 3.3 70B recipe on v6e-8; the chunk is the prompt tokens a step carries."""
    steps_per_s = 1e3 / tpot_ms
    chunk = round(tokens_per_s / 1000 * 999 / steps_per_s)     # requests/s x prompt tokens / steps per second
    return ProductRun(
        name=f"decode-vllm-llama3.3-70b-v6e-8-c{concurrency}", family="llama3-70b-serving", chip="v6e",
        topology="2d:2x4", accelerator="v6e-8", args=_args(_LLAMA3_70B, concurrency, 1500, chunk=chunk),
        published_s=tpot_ms / 1e3, published=f"mean TPOT {tpot_ms} ms",
        source="https://github.com/AI-Hypercomputer/tpu-recipes", where=f"{VLLM_RECIPE} @ {VLLM_COMMIT[:10]}: {lines}",
        setup=f"Llama 3.3 70B, vLLM (vllm/vllm-tpu:v0.12.0), tensor parallel 8, bf16 weights and KV cache; "
              f"concurrency {concurrency}, 1000-token prompts, 1000 output tokens",
        conversion=f"TPOT = one decode step of the {concurrency} running sequences; decoded at context 1500 (each "
                   f"runs 1000 -> 1999) with {chunk} prompt tokens a step ({tokens_per_s:g} output tokens/s / 1000 "
                   f"outputs x 999 prompt tokens / {steps_per_s:.1f} steps/s)",
        script="decode.py")


def _scaling_book(name: str, chapter: str, model: tuple[str, ...], batch: int, context: int, step_ms: float,
                  quote: str, setup: str, conversion: str, int8: bool = False) -> ProductRun:
    """One of the book's serving examples on v5e 2d:4x2 (8 chips, tensor parallel 8)."""
    return ProductRun(
        name=f"decode-scaling-book-{name}", family="scaling-book-serving", chip="v5e", topology="2d:4x2",
        accelerator="v5e-8", args=_args(model, batch, context, int8=int8),
        published_s=step_ms / 1e3, published=f"{step_ms:g} ms per step (analytic)", source=SCALING_BOOK + chapter,
        where=f"jax-ml/scaling-book {chapter.rstrip('/')}.md @ {SCALING_BOOK_COMMIT[:10]}: {quote}", setup=setup,
        conversion=conversion, script="decode.py")


MEASURED: tuple[ProductRun, ...] = (
    _vllm(64, 25.35, 2494.80, '"Mean TPOT (ms): 25.35", "Output token throughput (tok/s): 2494.80" '
                              '(MAX_CONCURRENCY=64)'),
    _vllm(128, 35.12, 3544.46, '"Mean TPOT (ms): 35.12", "Output token throughput (tok/s): 3544.46" '
                               '(MAX_CONCURRENCY=128)'),
)
ANALYTIC: tuple[ProductRun, ...] = (
    _scaling_book("llama3-70b-int8-b32", "applied-inference/", _LLAMA3_70B, 32, 8192, 17,
                  '"(KV size + param size) / (8 * HBM bandwidth) = 112e9 / (8 * 8.1e11) = 17ms"',
                  "LLaMA 3 70B, int8 weights and KV cache, batch 32 at context 8192, tensor parallel 8",
                  "the book's roofline: (KV cache 41.9e9 B + params 70e9 B) / (8 chips x 8.1e11 B/s)", int8=True),
    *(_scaling_book(f"llama2-13b-b{batch}", "inference/", _LLAMA2_13B, batch, 8192, step_ms,
                    f'"Theoretical Step Time (ms)" {step_ms} at batch size {batch} (LLaMA 2-13B on 8 v5e)',
                    f"LLaMA 2 13B, bf16, batch {batch} at context 8192, tensor parallel 8",
                    "the book's roofline: (params + KV cache) bytes / (8 chips x 0.82 TiB/s)")
      for batch, step_ms in ((1, 4.98), (16, 20.30))),
)
# Not taken: the book's 4x4 variant of the 70B example (8.5 ms): 8 K/V heads do not split over 16 chips by tensor
# parallelism (each would be held twice), so the script cannot halve the cache's bytes a chip as the book's halving
# assumes.


def token_step_seconds(run: ProductRun, chip: ChipSpec) -> tuple[float, float | None, int]:
    """(median decode step after the first, the prefill's time or None, decode steps) of ``run``'s recording priced
    on ``chip`` in Fused eager around its compiled programs, as `tpusim run --mode fused` prices it."""
    from tpusim.eager.modes import get_mode
    from tpusim.pricing import price
    from tpusim.pricing.plan import rank_records
    from tpusim.pricing.tokens import token_steps
    from tpusim.slice.topology import build_slice
    from tpusim.trace.phases import marked_spans

    trace, _ = recording(run)
    timeline = price(trace, topology=build_slice(run.topology, chip=chip), mode=get_mode("fused"))
    prefill, decode = marked_spans(next(iter(rank_records(trace).values())))
    steps = token_steps(timeline, prefill, decode, timeline.chips_simulated[0] if timeline.chips_simulated else 0)
    if steps is None:
        raise ValueError(f"case {run.name}: the recording has no decode step with device work")
    ttft = steps.prefill[1] - steps.prefill[0] if steps.prefill else None
    return median(steps.steady_s), ttft, len(steps.steps_s)


def roofline_seconds(run: ProductRun, chip: ChipSpec) -> float:
    """The HBM roofline of one decode step of ``run``'s recording: the weights and the KV cache a chip holds (as the
    report counts them: report.json ``inference``), read once at the chip's HBM bandwidth."""
    _, report = recording(run)
    section = report["inference"]
    return (section["weights_bytes"] + section["kv_cache"]["bytes"]) / chip.hbm_bytes_per_s


def predictor(run: ProductRun, kind: str):
    """A measured case predicts the priced decode step; an analytic one (the source's own roofline: bytes / HBM
    bandwidth) the recording's roofline, like with like, with the priced step beside it."""
    def predict(chip: ChipSpec) -> Prediction:
        tpot, ttft, count = token_step_seconds(run, chip)
        roofline = roofline_seconds(run, chip)
        notes = (f"validation/decode.py {' '.join(run.args)}",
                 f"{run.accelerator} = {run.topology}; prefill and decode step torch.compile'd; the median of decode "
                 f"steps 2-{count}" + (f"; prefill (TTFT) {ttft * 1e3:.1f} ms" if ttft else ""),
                 f"priced decode step {tpot * 1e3:.2f} ms = {tpot / roofline:.2f}x its HBM roofline "
                 f"({roofline * 1e3:.2f} ms: the weights and KV cache a chip holds, read once)")
        if kind == "analytic":
            return Prediction(roofline, {"weights_and_kv_cache_read_once": roofline}, notes)
        return Prediction(tpot, {"decode_step": tpot}, notes)

    return predict


def case(run: ProductRun, kind: str) -> Case:
    return Case(name=run.name, kind=kind, title=f"{run.setup.split(',')[0]} decode step on {run.accelerator}",
                chip=run.chip, slice=run.topology, setup=run.setup, published=run.published,
                published_s=run.published_s, source=run.source, where=run.where, predict=predictor(run, kind),
                conversion=run.conversion, model="validation/decode.py through `tpusim run` (product path)",
                slow=True, path="product", mode="compile", script=SERVING_SCRIPT, family=run.family)


CASES: tuple[Case, ...] = (*(case(run, "measured") for run in MEASURED), *(case(run, "analytic") for run in ANALYTIC))
__all__ = ["ANALYTIC", "CASES", "MEASURED", "token_step_seconds"]
