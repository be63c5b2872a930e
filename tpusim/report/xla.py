"""report.json's per-mode ``compiler`` and ``xla``: the TPU compiler's estimate of the compiled programs
beside tpusim's pricing of the same executions (``tpusim.xla.programs`` made the estimate)."""

from __future__ import annotations

from typing import Any

from tpusim.pricing.timeline import Timeline
from tpusim.report.schema import Report
from tpusim.trace.records import OpRecord, Trace
from tpusim.units import format_bytes, format_seconds
from tpusim.xla.programs import XlaEstimates


def model_seconds(timeline: Timeline, trace: Trace, programs: set[int]) -> float:
    """tpusim's device time for the kernels of the given program executions (rank 0's chip)."""
    records = trace.records
    return sum(e.end_s - e.start_s for e in timeline.events
               if e.kind == "op" and e.chip == 0 and 0 <= e.seq < len(records)
               and isinstance(records[e.seq], OpRecord) and records[e.seq].program in programs)


def xla_section(estimates: XlaEstimates, timeline: Timeline, trace: Trace) -> dict[str, Any]:
    """``compiler`` ("xla" when XLA priced any program, else "model") and, when it did, ``xla``: programs,
    executions, kernels, estimated_s (XLA's), model_s (tpusim's, same executions), hbm_peak_bytes, and
    the programs that fell back with why."""
    if not estimates.priced:
        return {"compiler": "model", "xla": {"fell_back": list(estimates.fell_back)}}
    executions = {n for p in estimates.compiled for n in p.programs}
    return {"compiler": "xla", "xla": {
        "programs": len(estimates.compiled),
        "executions": len(executions),
        "kernels": sum(p.kernels * len(p.programs) for p in estimates.compiled),
        "estimated_s": sum(p.estimated_s * len(p.programs) for p in estimates.compiled),
        "model_s": model_seconds(timeline, trace, executions),
        "hbm_peak_bytes": max(p.hbm_peak_bytes for p in estimates.compiled),
        "fell_back": list(estimates.fell_back),
    }}


def xla_lines(report: Report) -> list[str]:
    """The terminal's lines about the TPU compiler (none for a run without compiled programs): XLA's
    estimate beside tpusim's for the fastest mode, or, once, why the compiler priced nothing."""
    modes = {name: mode for name, mode in report.modes.items() if mode.xla is not None}
    if not modes:
        return []
    name, mode = min(modes.items(), key=lambda item: item[1].total_s)
    xla = mode.xla
    if mode.compiler != "xla":
        return [f"TPU compiler: not used ({xla.fell_back[0].split(': ', 1)[-1] if xla.fell_back else 'no program'})"]
    lines = [f"TPU compiler (XLA): {xla.programs} compiled graph{'s' if xla.programs != 1 else ''}, "
             f"{xla.executions} executions, {xla.kernels} kernels: XLA estimates {format_seconds(xla.estimated_s)}, "
             f"tpusim priced {format_seconds(xla.model_s)} ({name}); HBM peak {format_bytes(xla.hbm_peak_bytes)}"]
    lines += [f"  fell back to the model: {why}" for why in xla.fell_back]
    return lines
