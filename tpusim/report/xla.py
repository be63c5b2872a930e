"""report.json's per-mode ``compiler`` and ``xla``: what the TPU compiler built, priced three ways.

For the compiled programs' executions (``tpusim.xla.programs`` compiled them): ``priced_s``, tpusim's engine
on XLA's own kernels (what the step time now holds); ``estimated_s``, XLA's own estimate of the same
kernels; ``model_s``, tpusim's model of the same ops without the compiler (its own fusion rules), so a
user sees what the compiler changed and where the two disagree most (``per_program``).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from tpusim.eager.fusion import ClusterCall, fuse
from tpusim.hardware.compute import kernel_cost
from tpusim.hardware.spec import ChipSpec
from tpusim.pricing.timeline import Timeline
from tpusim.report.schema import Report
from tpusim.trace.records import OpRecord, Trace, rank_records, record_signature
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


def _ops_section(estimates: XlaEstimates, timeline: Timeline, trace: Trace, chip: ChipSpec) -> dict[str, Any]:
    """The eager work XLA compiled: op signatures (Strict, Debug: each op one executable) and Fused clusters;
    how many calls ran as XLA's kernels in this mode, and those calls priced three ways."""
    records = trace.records
    ran = {e.seq for e in timeline.events if e.kind == "op" and e.chip == 0 and e.name.startswith("xla:")
           and 0 <= e.seq < len(records) and isinstance(records[e.seq], OpRecord) and not records[e.seq].program}
    priced = sum(e.end_s - e.start_s for e in timeline.events if e.kind == "op" and e.chip == 0 and e.seq in ran
                 and e.name.startswith("xla:"))
    section = {"signatures": len(estimates.ops) + len(estimates.ops_fell_back), "compiled": len(estimates.ops),
               "clusters": len(estimates.clusters), "clusters_left": estimates.clusters_left,
               "calls": len(ran), "priced_s": priced, "fell_back": len(estimates.ops_fell_back)}
    if timeline.policy == "fused":           # the calls are clusters: each one XLA program of its ops
        clusters: list[tuple[int, int, ClusterCall]] = []
        model = fuse(next(iter(rank_records(trace).values()), ()), chip, eager=True, clusters_out=clusters).records
        found = {seq: (number, call) for number, seq, call in clusters}
        numbers = {found[seq][0] for seq in ran if seq in found}
        return {**section, "estimated_s": sum(estimates.clusters[found[seq][1]].estimated_s for seq in ran
                                              if seq in found and found[seq][1] in estimates.clusters),
                "model_s": sum(kernel_cost(k, chip).seconds for k in model
                               if isinstance(k, OpRecord) and getattr(k, "cluster", 0) in numbers)}
    calls = [records[seq] for seq in sorted(ran)]
    return {**section, "estimated_s": sum(estimates.ops[record_signature(op)].estimated_s for op in calls),
            "model_s": sum(kernel_cost(op, chip).seconds for op in calls)}


def xla_sections(estimates: XlaEstimates, timelines: dict[str, Timeline], trace: Trace,
                 chip: ChipSpec) -> dict[str, dict[str, Any]]:
    """Each mode's ``compiler`` and ``xla`` (``xla_section``); tpusim's own fusion of the programs, the same in
    every mode, is priced once."""
    model = _model_by_program(trace, chip) if estimates.priced else {}
    return {mode: xla_section(estimates, timeline, trace, chip, model) for mode, timeline in timelines.items()}


def xla_section(estimates: XlaEstimates, timeline: Timeline, trace: Trace, chip: ChipSpec,
                model: dict[int, float]) -> dict[str, Any]:
    """``compiler`` ("xla" when XLA priced any program or op, else "model") and, when it did, ``xla`` (see the
    module docstring), with the programs that fell back and why; ``model``: ``_model_by_program``."""
    if not estimates.priced:
        return {"compiler": "model", "xla": {"fell_back": list(estimates.fell_back)}}
    ops = _ops_section(estimates, timeline, trace, chip) if estimates.ops or estimates.clusters else None
    priced = _priced_by_program(timeline, trace)
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
        "hbm_peak_bytes": max((p["hbm_peak_bytes"] for p in per_program), default=0),
        "per_program": per_program,
        "ops": ops,
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
    lines = []
    if xla.programs:
        lines.append(f"TPU compiler (XLA): {xla.programs} compiled graph{'s' if xla.programs != 1 else ''}, "
                     f"{xla.executions} executions, {xla.kernels} kernels, priced by tpusim at "
                     f"{format_seconds(xla.priced_s)} ({name}); XLA's own estimate {format_seconds(xla.estimated_s)}; "
                     f"tpusim's model without the compiler {format_seconds(xla.model_s)}; HBM peak "
                     f"{format_bytes(xla.hbm_peak_bytes)}")
    lines += [f"  fell back to the model: {why}" for why in xla.fell_back]
    for mode_name, mode in modes.items():
        ops = mode.xla.ops
        if ops is None or not ops.calls:
            continue
        what = (f"{ops.clusters} Fused clusters compiled ({ops.clusters_left} left to the model)"
                if mode_name == "fused" else f"{ops.compiled} of {ops.signatures} eager op signatures compiled")
        lines.append(f"TPU compiler (XLA), {mode_name}: {what}; {ops.calls} calls priced by tpusim at "
                     f"{format_seconds(ops.priced_s)}; XLA's own estimate {format_seconds(ops.estimated_s)}; "
                     f"tpusim's model {format_seconds(ops.model_s)}")
    return lines
