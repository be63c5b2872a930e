"""report.json's per-mode ``compiler`` and ``xla``: what the TPU compiler built, priced three ways.

For the compiled programs' executions (``tpusim.xla.programs`` compiled them): ``priced_s``, tpusim's engine
on XLA's own kernels (what the step time now holds); ``estimated_s``, XLA's own estimate of the same
kernels; ``model_s``, tpusim's model of the same ops without the compiler (its own fusion rules), so a
user sees what the compiler changed and where the two disagree most (``per_program``).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from tpusim.eager.fusion import fuse
from tpusim.hardware.compute import kernel_cost
from tpusim.hardware.spec import ChipSpec
from tpusim.pricing.plan import rank_records
from tpusim.pricing.timeline import Timeline
from tpusim.report.schema import Report
from tpusim.trace.records import OpRecord, Trace
from tpusim.units import format_bytes, format_seconds
from tpusim.xla.programs import XlaEstimates


def _priced_by_program(timeline: Timeline, trace: Trace) -> dict[int, float]:
    """Device seconds of each program execution's kernels in the timeline (rank 0's chip)."""
    planned = {}
    for e in timeline.events:
        if e.kind == "op" and e.chip == 0 and 0 <= e.seq < len(trace.records):
            record = trace.records[e.seq]
            if isinstance(record, OpRecord) and record.program:
                planned[record.program] = planned.get(record.program, 0.0) + e.end_s - e.start_s
    return planned


def _model_by_program(trace: Trace, chip: ChipSpec) -> dict[int, float]:
    """Device seconds of each program execution under tpusim's own fusion of its ops (no compiler)."""
    seconds: dict[int, float] = defaultdict(float)
    records = next(iter(rank_records(trace).values()), ())
    for record in fuse(records, chip, eager=False).records:
        if isinstance(record, OpRecord) and record.program:
            seconds[record.program] += kernel_cost(record, chip).seconds
    return seconds


def xla_section(estimates: XlaEstimates, timeline: Timeline, trace: Trace, chip: ChipSpec) -> dict[str, Any]:
    """``compiler`` ("xla" when XLA priced any program, else "model") and, when it did, ``xla`` (see the module
    docstring), with the programs that fell back and why."""
    if not estimates.priced:
        return {"compiler": "model", "xla": {"fell_back": list(estimates.fell_back)}}
    priced, model = _priced_by_program(timeline, trace), _model_by_program(trace, chip)
    per_program = [{"label": p.label, "devices": p.devices, "executions": len(p.programs), "fusions": p.fusions,
                    "kernels": p.kernels, "estimated_s": p.estimated_s * len(p.programs),
                    "priced_s": sum(priced.get(n, 0.0) for n in p.executions),
                    "model_s": sum(model.get(n, 0.0) for n in p.executions),
                    "hbm_peak_bytes": p.hbm_peak_bytes, "compile_s": p.compile_s, "cached": p.cached}
                   for p in estimates.compiled]
    per_program.sort(key=lambda p: -abs(p["priced_s"] - p["model_s"]))   # where the compiler changed most first
    return {"compiler": "xla", "xla": {
        "programs": len(per_program),
        "executions": sum(p["executions"] for p in per_program),
        "fusions": sum(p["fusions"] for p in per_program),
        "kernels": sum(p["kernels"] * p["executions"] for p in per_program),
        "estimated_s": sum(p["estimated_s"] for p in per_program),
        "priced_s": sum(p["priced_s"] for p in per_program),
        "model_s": sum(p["model_s"] for p in per_program),
        "hbm_peak_bytes": max(p["hbm_peak_bytes"] for p in per_program),
        "per_program": per_program,
        "fell_back": list(estimates.fell_back),
    }}


def xla_lines(report: Report) -> list[str]:
    """The terminal's lines about the TPU compiler (none for a run without compiled programs): the three
    prices of the compiled programs for the fastest mode, or, once, why the compiler priced nothing."""
    modes = {name: mode for name, mode in report.modes.items() if mode.xla is not None}
    if not modes:
        return []
    name, mode = min(modes.items(), key=lambda item: item[1].total_s)
    xla = mode.xla
    if mode.compiler != "xla":
        return [f"TPU compiler: not used ({xla.fell_back[0].split(': ', 1)[-1] if xla.fell_back else 'no program'})"]
    lines = [f"TPU compiler (XLA): {xla.programs} compiled graph{'s' if xla.programs != 1 else ''}, "
             f"{xla.executions} executions, {xla.kernels} kernels, priced by tpusim at {format_seconds(xla.priced_s)} "
             f"({name}); XLA's own estimate {format_seconds(xla.estimated_s)}; tpusim's model without the compiler "
             f"{format_seconds(xla.model_s)}; HBM peak {format_bytes(xla.hbm_peak_bytes)}"]
    lines += [f"  fell back to the model: {why}" for why in xla.fell_back]
    return lines
