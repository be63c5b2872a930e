"""report.json: the versioned contract of a tpusim run (schema below), built from Timelines.

``build_report`` is where the typed parts of a run become the report, once (a ``Report``, the typed
model of report.json: tpusim/report/schema.py, which writes it and its JSON Schema): what ran
(``RunInfo``), the trace, the slice, one Timeline per mode, the lint warnings
(``tpusim.report.lint.LintWarning``), and the optional sections (``tpusim.placement.Distributed``,
``tpusim.placement.PlacementComparison``, ``tpusim.report.measured.Measured``).

The same inputs give a byte-identical file: no wall-clock times (except in ``measured``, which
only --target pjrt writes), sorted keys, floats rounded to 9 significant digits, lists in a
defined order.

Schema ``tpusim-report`` version 6. Version 6 names each utilisation for what it holds: ``hfu`` (modes.<mode>,
headline, an inference phase's; ``mfu`` in older versions, and ``mxu_utilisation`` in a phase) and the headline's
``peak_flops_per_s`` (was ``mfu_peak_flops_per_s``). Version 5 adds ``inference`` (null for a program without decode
steps). Version 4: ``step_time_median_s`` is null when the script marks no steps
(earlier versions wrote the whole program's time there). Version 3: ``step_time_median_s`` and ``mfu`` are the
steady state's (warm-up steps that compiled are left out: ``steps``); in version 2 the median took every step after the
first, warm-up compiles included. Version 1 also lacked ``exit_code`` and ``interrupted`` and read
``complete: true`` after ``sys.exit(3)``. ``tpusim.report.load`` reads all six; ``tpusim compare`` says
when it compares a version 3 or 4 report with an older one::

    schema, version            "tpusim-report", 6
    complete                   true only when the script ran to its end with exit status 0, nothing
                               was interrupted and every mode asked for was priced
    error                      {type, traceback} when the script raised, else null
    exit_code                  the script's exit status, as `python script.py` would give it (0; 1 when it
                               raised; N for sys.exit(N); 130 when Ctrl-C stopped it, 143 SIGTERM, 129 SIGHUP)
    interrupted                null, or what Ctrl-C, SIGTERM or SIGHUP stopped: {script, pricing (true/false),
                               not_priced [modes asked for but not priced], by ("Ctrl-C", "SIGTERM", "SIGHUP")};
                               the report covers what was done before
    recording_stopped          null, or the record budget stopped recording (TPUSIM_MAX_RECORDS, --max-records):
                               {after_step (0: before any step: the trace is the program's first `records`
                               records, "whole program (partial)"), steps (all the script ran, counted after
                               the stop too), records (the trace kept), max_records, note (in words), ranks
                               (--ranks all: [{rank, after_step, steps, records}] per rank the budget
                               stopped; [] otherwise)}; every mode prices what was recorded only
    run                        script, argv, tpusim_version, torch_version, chip, topology,
                               world_size, modes, numerics, target, tokens_per_step (--tokens-per-step; null)
    chip                       name, display_name and the peaks the report compares against (peak_flops_per_s:
                               the matmul peak per dtype class, float32 at the program's precision); calibration
                               (the calibration file the chip carried, topologies/calibration/<chip>.toml,
                               or "datasheet": --no-calibration, or a generation without a file)
    slice                      Slice.to_dict(): chips, dims, wrap, links, diameter, bisection; shape_note
                               (null, or why the shape is no slice the chip is offered in: tpusim/slice/shapes.py)
    program                    what one rank's trace holds: ops, collectives, syncs, steps, model_flops;
                               ranks_recorded (1, or every rank with --ranks all)
    modes.<mode>               one entry per eager mode priced (debug, strict, fused):
      total_s                  simulated wall time of the whole program
      steps_s                  every step's time; first_step_s (null without steps) separately;
      steps                    count, warmup (leading steps that compiled: left out of the median),
                               compiles [per step], reason (in words), steady_median_s (null without
                               steps), steady_start_s, steady_end_s (tpusim/report/steps.py)
      step_time_median_s       median of the steady-state steps; null when the script marks no steps (total_s
                               is then the only time: no step time is made up)
      headline                 the steady-state step's numbers (tpusim/report/headline.py): step_s,
                               tokens_per_step, tokens_per_s_per_slice/_per_chip (null unless given),
                               flops_per_step_per_chip, tflops_per_s_per_chip, hfu, peak_flops_per_s,
                               flops_by_dtype, hbm_peak_bytes/_fraction, exposed_comm_share, bound,
                               bound_shares, verdict, levers (lint codes that would move the bound)
      device_s                 device timeline split: mxu, vpu, transcendental, hbm, sparsecore,
                               launch (op time by the term that bound it), collective_exposed,
                               idle; they sum to total_s (per simulated chip)
      step_device_s            the same split for one average steady-state step (the whole program
                               when there are no steps)
      host_s                   host timeline split: dispatch (incl. fused window recording and
                               debug's result read-back), stall, transfer, compile (cache misses)
      collective_overlapped_s  collective time hidden under compute
      mxu_utilisation          useful MXU FLOPs / (time in MXU kernels x each kernel's dtype peak)
      hfu                      headline.hfu, hardware FLOPs utilisation (``mfu`` before version 6): the steady
                               step's FLOPs, every one run, / (its time x the FLOP-weighted MXU peak of the
                               dtypes the matmuls used); MFU (6 x params x tokens) is headline's
                               model_flops_utilisation
      kernels                  kernels launched (per rank)
      hbm_bytes_moved          HBM bytes read + written by all kernels (fused: only values that
                               enter or leave a kernel)
      compile_cache            regions (kernel launches looked up), hits, misses, compile_s (each miss:
                               chip compile_s + compile_per_op_s x its ops), recompile_count,
                               recompiles: [{seq, source, op, old_shapes, new_shapes}] (first
                               RECOMPILES_LISTED; a recompile is a miss at a known source position
                               with new shapes, inside the step loop: the lint's rule)
      fusion                   fused, or any mode of a program with torch.compile'd graphs, else null:
                               ops (in eager windows), kernels, windows (Fused clusters), cuts {rule
                               that ended a cluster: count}, clusters_compiled (distinct clusters),
                               onchip_bytes (intermediate writes + reads kept on chip), reused_bytes,
                               spilled_bytes (held across a reduction but over VMEM, counted as
                               HBM); programs (compiled-graph
                               executions, each fused whole), program_ops, program_kernels
      hbm                      peak_bytes, capacity_bytes, peak_fraction
      top_ops                  [{op, source, count, seconds, flops, bytes, bound, dtype}] by seconds
                               (dtype: whose MXU peak a matmul kernel ran at, e.g. int8)
      collectives              [{seq, kind, bytes, group_size, axes, algorithm, reason,
                                 time_s (DES, in this run), closed_form_s (alone on an idle
                                 network), contention_s (DES minus closed form: time lost to
                                 other traffic on the same links; 0 below the resolution), async, source}]
      collective_groups        [{kind, group_size, axes, bytes, source, count, algorithms, total_s,
                                 closed_form_total_s, contention_total_s, total_bytes}] by total_s
      links                    over the steady-state window (window_s) and the whole slice by symmetry
                               (tpusim/report/links.py): max_utilisation, mean_utilisation (busy links),
                               busy_links, simulated_links, busiest [{link, utilisation, bytes, simulated}],
                               per_chip [[coord, mean outgoing-link utilisation]]
      host_stalls              [{reason, source, seconds}] where the host waited for the device
      offload                  (only when activations were kept on the host; tpusim/report/offload.py)
                               host_peak_bytes, d2h_bytes, h2d_bytes, d2h_copies, h2d_copies, pcie_s, pcie_exposed_s
      largest_batch            (only with --fit-batch ARG; tpusim/run/batch_fit.py) argument ("--batch"), value (the
                               largest that fits; 0: not even 1), exact, peak_bytes, next_peak_bytes (at value + 1),
                               capacity_bytes, recordings
    warnings                   [{code, message, source}] (TPU-readiness lint; codes: tpusim/report/lint.py RULES)
    distributed                (tpusim run only) ranks ("one" | "all"), world_size, placement
                               ("tp=x,fsdp=yz"), numerics_rule, not_reference_correct [{kind, source,
                               count, why}]: --ranks one values that follow the symmetry rule
    placements                 (--compare-placements) mesh {dim_names, shape}, default, reason (why the
                               best wins), ranked [{placement, step_s, total_s, collective_s, by_dim,
                               axes, algorithms}] by step time (tpusim/placement/compare.py)
    inference                  null, or a program with decode steps (tpusim/report/inference.py; docs/report.md):
                               phases_from ("marked" | "detected"), batch, prompt_tokens, decode_steps,
                               weights_bytes (per chip), kv_cache {bytes, bytes_per_sequence, bytes_per_token,
                               context, dtype, tensors, static}, fits {hbm_bytes, needed_bytes, fits, batch,
                               context, max_batch_at_context, max_context_at_batch, line}, modes.<mode> {ttft_s,
                               tpot_median_s, tpot_p90_s, decode_steps_s, decode_s, tokens_per_s_per_chip/_slice,
                               roofline_step_s, roofline_ratio, prefill and decode {time_s, hfu,
                               hbm_utilisation, bound, bound_shares, verdict}, verdict}
    measured                   (--target pjrt only; wall-clock times, so they differ run to run) the script run
                               for real through JAX, one fresh process per mode (tpusim/report/measured.py):
      platform, device_kind    JAX's default device ("tpu", "TPU v5 lite"; "cpu", "cpu"); is_tpu, jax_version
      chip, chip_from          the chip every other section was priced on, and why: "device" (JAX's TPU),
                               "--chip", or "default" (JAX's device is no TPU, or one without a chip file)
      baseline                 the mode the ratios divide by: strict when it was run, else the first mode
      notes                    [str] what to know before comparing, e.g. "JAX device is cpu: absolute times
                               are not comparable with the TPU prediction; compare the ratios between modes"
      modes.<mode>             steps (steps measured: optimizer.step() / tpusim.backend.step() calls),
                               steps_s, first_step_s, step_time_median_s (after the first step), total_s;
                               simulated_step_time_median_s (modes.<mode>.step_time_median_s);
                               ratio {measured, simulated}: this mode's median step / the baseline's;
                               target_mode (the PJRT target's own mode), exit_code, error {type, traceback}
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from tpusim import __version__
from tpusim.hardware.calibration import calibration_label
from tpusim.hardware.compute import MATMUL_DTYPES, mxu_peak_flops_per_s, rate_class
from tpusim.hardware.spec import ChipSpec
from tpusim.placement import Distributed, PlacementComparison
from tpusim.pricing import priced_chip
from tpusim.pricing.timeline import Timeline
from tpusim.report import fidelity
from tpusim.report.collectives import collective_entry, group_collectives
from tpusim.report.dcn import dcn_entry
from tpusim.report.headline import NO_STEPS_MARKED, headline
from tpusim.report.inference import inference_section
from tpusim.report.links import link_summary
from tpusim.report.lint import LintWarning, step_loop_recompiles
from tpusim.report.measured import Measured, measured_section
from tpusim.report.offload import offload_entry
from tpusim.report.schema import Report
from tpusim.report.steps import split_steps
from tpusim.report.text import resolved
from tpusim.report.xla import xla_sections
from tpusim.slice.topology import Slice
from tpusim.trace.records import CollectiveRecord, HostRecord, OpRecord, StepMarker, Trace
from tpusim.xla.programs import XlaEstimates

SCHEMA = "tpusim-report"
SCHEMA_VERSION = 6
TOP_OPS = 20
RECOMPILES_LISTED = 20
DEVICE_TERMS = ("mxu", "vpu", "transcendental", "hbm", "sparsecore", "launch")


@dataclass(frozen=True)
class Interrupted:
    """What Ctrl-C (or SIGTERM, SIGHUP) stopped in a run (report.json's ``interrupted``)."""

    script: bool = False                # the script itself (its exit status is then 130; 143 for SIGTERM)
    pricing: bool = False               # pricing: the modes in ``not_priced`` were never priced
    not_priced: tuple[str, ...] = ()
    by: str = "Ctrl-C"                  # what stopped it: "Ctrl-C", "SIGTERM" or "SIGHUP"


@dataclass(frozen=True)
class RankStopped:
    """Where the record budget stopped one rank of a --ranks all run (its own budget, its own records)."""

    rank: int
    after_step: int                     # 0: before its first step
    steps: int
    records: int


@dataclass(frozen=True)
class RecordingStopped:
    """The record budget stopped recording after step ``after_step`` of the ``steps`` the script ran
    (report.json's ``recording_stopped``); ``after_step`` 0: before any step, so the trace is a prefix
    of the program; ``note`` is the sentence users read; ``ranks``: --ranks all's stops."""

    after_step: int
    steps: int
    max_records: int
    note: str
    records: int = 0                    # the records the trace kept (every rank's, merged)
    ranks: tuple[RankStopped, ...] = ()


@dataclass(frozen=True)
class RunInfo:
    """What was run, for the report's ``run`` section, and how it ended."""

    script: str
    argv: tuple[str, ...] = ()
    topology: str = ""
    numerics: str = "on"
    target: str = "sim"
    torch_version: str = ""
    error_type: str | None = None
    error_traceback: str | None = None
    exit_code: int = 0                  # the script's exit status
    interrupted: Interrupted | None = None
    tokens_per_step: int | None = None  # global batch x sequence length (tpusim run --tokens-per-step)
    recording_stopped: RecordingStopped | None = None   # the record budget stopped recording


def build_report(info: RunInfo, trace: Trace, slice_: Slice, timelines: dict[str, Timeline],
                 warnings: Sequence[LintWarning] = (), *, distributed: Distributed | None = None,
                 placements: PlacementComparison | None = None, measured: Measured | None = None,
                 faults: dict[str, Any] | None = None, xla: XlaEstimates | None = None,
                 largest_batch: Mapping[str, dict[str, Any]] | None = None) -> Report:
    """The report of a run (report.json's typed model, tpusim/report/schema.py): every section from its typed
    part (see the module docstring)."""
    chip = slice_.chip
    codes = frozenset(w.code for w in warnings)
    report = {
        "schema": SCHEMA,
        "version": SCHEMA_VERSION,
        "complete": info.error_type is None and info.exit_code == 0 and info.interrupted is None,
        "error": None if info.error_type is None else {"type": info.error_type,
                                                       "traceback": info.error_traceback},
        "exit_code": info.exit_code,
        "interrupted": None if info.interrupted is None else asdict(info.interrupted),
        "recording_stopped": None if info.recording_stopped is None else asdict(info.recording_stopped),
        "run": {"script": info.script, "argv": list(info.argv), "tpusim_version": __version__,
                "torch_version": info.torch_version, "chip": chip.name, "topology": slice_.spec,
                "world_size": slice_.total_chips, "modes": list(timelines), "numerics": info.numerics,
                "target": info.target, "tokens_per_step": info.tokens_per_step},
        "chip": chip_summary(chip, trace),
        "slice": slice_.to_dict(),
        "program": program_summary(trace),
        "modes": {mode: mode_report(timeline, trace, slice_, info.tokens_per_step, codes,
                                    prefix=info.recording_stopped is not None and not info.recording_stopped.after_step)
                  for mode, timeline in timelines.items()},
        "warnings": [asdict(w) for w in warnings],
        "inference": inference_section(trace, timelines, chip, slice_.total_chips, device_split),
    }
    if report["inference"] is not None:     # a decode loop marks no training steps, and nothing is wrong with that
        for section in report["modes"].values():
            head = section["headline"]
            head["verdict"] = head["verdict"].replace(NO_STEPS_MARKED, "an inference program (no training steps; "
                                                      "per phase: inference), so over")
    if xla is not None:             # the run had compiled programs: who priced them (tpusim/report/xla.py)
        for mode, section in xla_sections(xla, timelines, trace, chip).items():
            report["modes"][mode].update(section)
    ran_compiled = fidelity.compiled(trace)
    for mode, section in report["modes"].items():      # the band of the path that priced the mode
        section["fidelity"] = fidelity.fidelity(mode, ran_compiled, section.get("compiler", "model"))
    if distributed is not None:
        report["distributed"] = asdict(distributed)
    if placements is not None:
        report["placements"] = placements_section(placements)
    if faults is not None:          # tpusim.slice.faults.slowdown_section: the faulted slice against the healthy one
        report["faults"] = faults
    for mode, fit in (largest_batch or {}).items():     # --fit-batch: tpusim/run/batch_fit.py
        if mode in report["modes"]:
            report["modes"][mode]["largest_batch"] = dict(fit)
    report = rounded(report)
    if measured is not None:        # after rounding: it compares with the rounded simulated medians
        world = slice_.total_chips if report["program"]["collectives"] else 1
        report["measured"] = rounded(measured_section(measured, report["modes"], world))
    return Report.model_validate(report)


def incomplete_reason(report: Report) -> str | None:
    """Why a report is incomplete, in words ("the script exited with status 3"); None when it is complete.
    Reads reports of every version ``tpusim.report.load`` reads."""
    if report.complete:
        return None
    reasons = []
    interrupted, error, code = report.interrupted, report.error, report.exit_code
    if interrupted is not None and interrupted.script:
        reasons.append(f"{interrupted.by} stopped the script")
    elif error is not None and error.type:
        reasons.append(f"the script raised {error.type}")
    elif code:
        reasons.append(f"the script exited with status {code}")
    if interrupted is not None and interrupted.pricing:
        not_priced = ", ".join(interrupted.not_priced)
        reasons.append(f"{interrupted.by} stopped pricing" + (f" ({not_priced} not priced)" if not_priced else ""))
    return "; ".join(reasons) or "the run did not finish"


def placements_section(comparison: PlacementComparison) -> dict[str, Any]:
    """--compare-placements: the mesh (its dims and shape), the default placement, the ranking and why."""
    if comparison.mesh is None:
        return {"mesh": None, "ranked": [], "reason": comparison.reason}
    return {"mesh": {"dim_names": list(comparison.mesh.dim_names), "shape": list(comparison.mesh.shape)},
            "default": comparison.default, "ranked": [asdict(p) for p in comparison.ranked],
            "reason": comparison.reason}


def chip_summary(chip: ChipSpec, trace: Trace) -> dict[str, Any]:
    """The chip's numbers the report compares against; the matmul peak per dtype is the priced one (float32 at
    the program's matmul precision), so the roofline's roofs are the ones its ops ran under."""
    priced = priced_chip(chip, trace)
    return {"name": chip.name, "display_name": chip.display_name,
            "peak_bf16_flops_per_s": chip.peak_bf16_flops_per_s,
            "peak_flops_per_s": {kind: mxu_peak_flops_per_s(priced, kind) for kind in MATMUL_DTYPES},
            "hbm_bytes": chip.hbm_bytes,
            "hbm_bytes_per_s": chip.hbm_bytes_per_s, "ici_link_bytes_per_s": chip.ici_link_bytes_per_s,
            "mxu_size": chip.mxu_size, "calibration": calibration_label(chip)}


def program_summary(trace: Trace) -> dict[str, Any]:
    """Counts for one rank (the lowest recorded): with --ranks all every rank ran the program."""
    ranks = sorted({r.rank for r in trace.records})
    records = [r for r in trace.records if r.rank == ranks[0]] if ranks else []
    ops = [r for r in records if isinstance(r, OpRecord)]
    return {"ops": len(ops), "collectives": sum(isinstance(r, CollectiveRecord) for r in records),
            "syncs": sum(isinstance(r, HostRecord) and r.event == "sync" for r in records),
            "steps": sum(isinstance(r, StepMarker) for r in records), "model_flops": sum(op.flops for op in ops),
            "ranks_recorded": len(ranks)}


def mode_report(timeline: Timeline, trace: Trace, slice_: Slice, tokens_per_step: int | None = None,
                warning_codes: frozenset[str] = frozenset(), *, prefix: bool = False) -> dict[str, Any]:
    """One mode's section: steps split into warm-up and steady state, the headline numbers, the tables.
    ``prefix``: the record budget stopped recording before any step (the trace is the program's start)."""
    chip = slice_.chip
    chips = max(1, len(timeline.chips_simulated))
    steps = split_steps(timeline)
    device = device_split(timeline, 0.0, timeline.total_s)
    exposed = device["collective_exposed"]
    steady = (device_split(timeline, steps.steady_start_s, steps.steady_end_s, steps.steady)
              if steps.count else device)
    calls = [collective_entry(run) for run in timeline.collectives]
    dcn = dcn_entry(timeline, slice_, steps)
    head = headline(timeline, trace, chip, steps, steady, slice_.total_chips, tokens_per_step, set(warning_codes),
                    prefix=prefix, dcn_exposed_s=(dcn["dcn"]["step_exposed_s"] or 0.0) if dcn else 0.0)
    return {
        "total_s": timeline.total_s,
        "steps_s": [s.seconds for s in timeline.steps],
        "first_step_s": timeline.steps[0].seconds if timeline.steps else None,
        "step_time_median_s": steps.steady_median_s if steps.count else None,
        "steps": asdict(steps),
        "headline": head,
        "device_s": device,
        "step_device_s": steady,
        "host_s": {"dispatch": timeline.host_dispatch_s / chips, "stall": timeline.host_stall_s / chips,
                   "transfer": timeline.host_transfer_s / chips, "compile": timeline.host_compile_s / chips},
        "collective_overlapped_s": resolved(max(0.0, timeline.collective_s - exposed), timeline.collective_s),
        "mxu_utilisation": mxu_utilisation(timeline, chip),
        "hfu": head["hfu"],
        "kernels": timeline.kernels // chips,
        "hbm_bytes_moved": timeline.hbm_bytes_moved,
        "compile_cache": compile_cache(timeline, trace),
        "fusion": timeline.meta.get("fusion"),
        "hbm": {"peak_bytes": timeline.peak_hbm_bytes, "capacity_bytes": chip.hbm_bytes,
                "peak_fraction": timeline.peak_hbm_bytes / chip.hbm_bytes},
        "top_ops": top_ops(timeline),
        "collectives": calls,
        "collective_groups": group_collectives(calls),
        "links": link_summary(timeline, tuple(slice_.dims), steps.steady_start_s, steps.steady_end_s),
        "host_stalls": host_stalls(timeline),
        **offload_entry(timeline, trace),
        **dcn,
    }


def device_split(timeline: Timeline, start: float, end: float, per: int = 1) -> dict[str, float]:
    """Device time in [start, end) by what bound each op, exposed collective waits, and idle; per chip,
    divided by ``per`` (steps) to give a per-step average."""
    chips = max(1, len(timeline.chips_simulated))
    split = dict.fromkeys((*DEVICE_TERMS, "collective_exposed"), 0.0)
    for event in timeline.events:
        overlap = min(event.end_s, end) - max(event.start_s, start)
        if overlap <= 0:
            continue
        if event.kind == "op" and event.bound in split:
            split[event.bound] += overlap
        elif event.kind == "wait" and event.bound == "collective":
            split["collective_exposed"] += overlap
    split = {term: seconds / chips / per for term, seconds in split.items()}
    split["idle"] = max(0.0, (end - start) / per - sum(split.values()))
    return split


def mxu_utilisation(timeline: Timeline, chip: ChipSpec) -> float:
    """Useful FLOPs of the kernels that ran on the MXU (as this mode priced them: fused kernels carry
    their epilogues) over what the MXUs could do in the time those kernels ran, each kernel at its own
    dtype's peak (an int8 matmul at int8's, twice bf16's on v5p: against bf16's it would read > 100%)."""
    flops = capacity = 0.0
    for e in timeline.events:
        if e.kind == "op" and e.cost is not None and e.cost.unit == "mxu":
            flops += e.cost.flops
            capacity += e.cost.seconds * mxu_peak_flops_per_s(chip, rate_class(e.dtype))
    return flops / capacity if capacity else 0.0


def compile_cache(timeline: Timeline, trace: Trace) -> dict[str, Any] | None:
    """The mode's compile-cache figures (None for a policy without a cache); recompiles counted as the lint
    counts them (``step_loop_recompiles``), so the summary, report.json and ``tpusim check`` agree."""
    stats = timeline.meta.get("compile_cache")
    if stats is None:
        return None
    recompiles = step_loop_recompiles(trace, stats.recompiles)
    return {"regions": stats.regions, "hits": stats.hits, "misses": stats.misses, "compile_s": stats.compile_s,
            "recompile_count": len(recompiles), "recompiles": [asdict(r) for r in recompiles[:RECOMPILES_LISTED]]}


def top_ops(timeline: Timeline) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str], dict[str, Any]] = defaultdict(
        lambda: {"count": 0, "seconds": 0.0, "flops": 0.0, "bytes": 0.0, "bounds": defaultdict(float), "dtype": ""})
    for event in timeline.events:
        if event.kind == "op":
            group = groups[(event.name, event.source)]
            group["count"] += 1
            group["seconds"] += event.seconds
            group["flops"] += event.flops
            group["bytes"] += event.bytes
            group["bounds"][event.bound] += event.seconds
            group["dtype"] = group["dtype"] or event.dtype
    entries = [{"op": name, "source": source, "count": g["count"], "seconds": g["seconds"],
                "flops": g["flops"], "bytes": g["bytes"],
                "bound": max(sorted(g["bounds"]), key=g["bounds"].__getitem__), "dtype": g["dtype"]}
               for (name, source), g in groups.items()]
    entries.sort(key=lambda e: (-e["seconds"], e["op"], e["source"]))
    return entries[:TOP_OPS]


def host_stalls(timeline: Timeline) -> list[dict[str, Any]]:
    stalls: dict[tuple[str, str], float] = defaultdict(float)
    for event in timeline.events:
        if event.kind == "stall":
            stalls[(event.bound, event.source)] += event.seconds
    entries = [{"reason": reason, "source": source, "seconds": s} for (reason, source), s in stalls.items()]
    entries.sort(key=lambda e: (-e["seconds"], e["reason"], e["source"]))
    return entries[:TOP_OPS]


def rounded(value: Any) -> Any:
    """Floats to 9 significant digits (stable across platforms), recursively; tuples to lists."""
    if isinstance(value, float):
        if not math.isfinite(value) or value == 0:
            return value
        return float(f"{value:.9g}")
    if isinstance(value, dict):
        return {str(k): rounded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [rounded(v) for v in value]
    if hasattr(value, "__dataclass_fields__"):
        return rounded(asdict(value))
    return value
