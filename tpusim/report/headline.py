"""The headline numbers ML engineers compare, for one mode's steady-state step, and what bounds it.

Why here, once: the terminal summary, report.html and report.json show the same numbers, so they are
computed from the Timeline in one place (report.json ``modes.<mode>.headline``) and the others read them.

- tokens/s per slice and per chip: only when the tokens per step are known (``tpusim run
  --tokens-per-step N``, the global batch x sequence length); else None, never a guess.
- TFLOP/s per chip: the FLOPs of the ops that ran in the steady-state steps over their time.
- HFU (hardware FLOPs utilisation; the ``hfu`` key, ``mfu`` before report version 6): those FLOPs, every
  one the chip ran (recomputation included), over what the chip could do at the peak of the dtypes actually
  used (each op's FLOPs at its own dtype's MXU peak: bf16, f32, int8, fp8; dtypes without an MXU rate at
  bf16's).
- MFU as the field defines it (``model_flops_utilisation``): 6 x the parameters an optimizer step updated x
  the tokens per step, per chip, over the same peak; only when both are known (``--tokens-per-step``, and
  an optimizer stepping tpu parameters); attention's FLOPs are not counted (the "6N" convention).
- exposed communication share: device time waiting for collectives, over the step.
- bound: the largest share of the step (BOUNDS below), with the lint codes that would move it; None when
  no kernel ran (an idle device is bound by nothing); without steps the verdict says it is the whole program's.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from tpusim.errors import TpusimError
from tpusim.hardware.compute import mxu_peak_flops_per_s
from tpusim.hardware.spec import ChipSpec
from tpusim.pricing.timeline import Timeline
from tpusim.report.steps import Steps
from tpusim.trace.records import OpRecord, Trace

NO_STEPS_MARKED = "no steps marked, so over"   # the verdict of a program without steps starts so

# What can bound a step: name -> (device_split terms it sums, words, lint codes that move it).
# Adding a bound = one row here.
BOUNDS: dict[str, tuple[tuple[str, ...], str, tuple[str, ...]]] = {
    "host dispatch": (("idle", "launch"), "the device idle or launching kernels, waiting for the host to "
                      "issue ops one at a time (Fused eager or torch.compile issue fewer)",
                      ("host-sync", "float64", "graph-break", "eager-graph")),
    "compile": (("compile",), "compile-cache misses inside the steady-state steps",
                ("recompile", "dynamo-recompile")),
    "MXU": (("mxu",), "matmuls on the MXU", ("mxu-padding",)),
    "VPU": (("vpu", "transcendental"), "elementwise work on the vector units", ()),
    "HBM": (("hbm",), "kernels waiting on HBM bandwidth", ()),
    "SparseCore": (("sparsecore",), "embedding lookups on the SparseCores", ()),
    "ICI": (("collective_exposed",), "collectives that compute does not hide", ("comm-bound",)),
    # the part of the exposed collectives whose groups span slices (multislice), moved out of ICI's share
    "DCN": ((), "collectives between slices over DCN that compute does not hide", ("comm-bound",)),
}


def peak_of_dtypes(trace: Trace, chip: ChipSpec) -> tuple[float, dict[str, float]]:
    """The FLOP-weighted MXU peak of the dtypes the program's matmuls used (the time at peak of each dtype's
    FLOPs, summed), and each dtype's share of those FLOPs; bf16's peak when nothing ran on the MXU."""
    flops: Counter[str] = Counter()
    for op in trace.of_kind(OpRecord):
        if op.flops > 0 and op.unit == "mxu":
            flops[op.dtype] += op.flops
    total = sum(flops.values())
    if not total:
        return chip.peak_bf16_flops_per_s, {}
    seconds_at_peak = 0.0
    for dtype, n in flops.items():
        try:
            peak = mxu_peak_flops_per_s(chip, dtype)
        except TpusimError:              # bool, int64, ...: no MXU rate; priced at bf16's like the VPU
            peak = chip.peak_bf16_flops_per_s
        seconds_at_peak += n / peak
    return total / seconds_at_peak, {d: n / total for d, n in sorted(flops.items())}


def steady_compile_s(timeline: Timeline, steps: Steps) -> float:
    """Host compile time inside the steady-state steps, per step and chip."""
    if not steps.count or not steps.steady:
        return 0.0
    seconds = sum(min(e.end_s, steps.steady_end_s) - max(e.start_s, steps.steady_start_s)
                  for e in timeline.events if e.kind == "compile" and e.end_s > steps.steady_start_s
                  and e.start_s < steps.steady_end_s)
    return seconds / max(1, len(timeline.chips_simulated)) / steps.steady


def headline(timeline: Timeline, trace: Trace, chip: ChipSpec, steps: Steps, step_device: dict[str, float],
             world_size: int, tokens_per_step: int | None, warning_codes: set[str], *,
             prefix: bool = False, dcn_exposed_s: float = 0.0) -> dict[str, Any]:
    """report.json ``modes.<mode>.headline`` (see the module docstring); ``prefix``: the trace is only the
    program's start (the record budget stopped it before any step); ``dcn_exposed_s``: the part of
    ``step_device``'s exposed collectives spent on groups that span slices (tpusim/report/dcn.py)."""
    chips = max(1, len(timeline.chips_simulated))
    step_s = steps.steady_median_s if steps.count else None
    window = steps.steady_end_s - steps.steady_start_s
    per = steps.steady if steps.count else 1      # no steps: the whole program stands for one "step"
    flops = sum(e.flops for e in timeline.events if e.kind == "op"
                and steps.steady_start_s <= e.start_s < steps.steady_end_s) / chips / per
    peak, dtypes = peak_of_dtypes(trace, chip)
    seconds = step_s if step_s else window / per
    shares = {name: sum(step_device.get(term, 0.0) for term in terms) for name, (terms, _, _) in BOUNDS.items()}
    compile_s = min(steady_compile_s(timeline, steps), shares["host dispatch"])
    shares["compile"], shares["host dispatch"] = compile_s, shares["host dispatch"] - compile_s
    shares["DCN"] = min(dcn_exposed_s, shares["ICI"])
    shares["ICI"] -= shares["DCN"]
    total = sum(shares.values()) or 1.0
    shares = {name: value / total for name, value in shares.items()}
    bound = max(shares, key=shares.__getitem__)
    _, words, codes = BOUNDS[bound]
    levers = sorted(code for code in codes if code in warning_codes)
    line = verdict(bound, shares[bound], words, levers)
    if not any(e.kind == "op" for e in timeline.events):     # an idle device is bound by nothing
        bound, levers, line = None, [], "nothing ran on the device (no kernels): no bound to report"
    elif not steps.count:
        span = "the recorded start of the program (the record budget stopped it)" if prefix else "the whole program"
        line = f"{NO_STEPS_MARKED} {span}: {line}"
    parameters = trace.meta.trained_parameters
    model_flops = 6.0 * parameters * tokens_per_step / world_size if parameters and tokens_per_step else None
    return {
        "step_s": step_s,
        "tokens_per_step": tokens_per_step,
        "tokens_per_s_per_slice": tokens_per_step / step_s if tokens_per_step and step_s else None,
        "tokens_per_s_per_chip": tokens_per_step / step_s / world_size if tokens_per_step and step_s else None,
        "flops_per_step_per_chip": flops,
        "tflops_per_s_per_chip": flops / seconds / 1e12 if seconds else 0.0,
        "hfu": flops / (seconds * peak) if seconds else 0.0,
        "peak_flops_per_s": peak,
        "model_flops_per_step_per_chip": model_flops,
        "model_flops_utilisation": model_flops / (seconds * peak) if model_flops and seconds else None,
        "flops_by_dtype": dtypes,
        "hbm_peak_bytes": timeline.peak_hbm_bytes,
        "hbm_peak_fraction": timeline.peak_hbm_bytes / chip.hbm_bytes,
        "exposed_comm_share": step_device.get("collective_exposed", 0.0) / seconds if seconds else 0.0,
        "bound": bound,
        "bound_shares": shares,
        "verdict": line,
        "levers": levers,
    }


def verdict(bound: str, share: float, words: str, levers: list[str]) -> str:
    """One line: what bounds the step, by how much, and the lint items that would move it."""
    line = f"{bound}-bound: {share:.0%} of the step is {words}"
    return line + (f"; see warnings {', '.join(levers)}" if levers else "")
