"""The table `tpusim run` prints at the end: one column per eager mode, then recompiles by source line."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpusim.report.fidelity import band_text
from tpusim.report.model import incomplete_reason
from tpusim.report.schema import CompileCache, Headline, InferenceMode, InferenceSection, ModeSection, Report, StepsInfo
from tpusim.report.text import HFU_LABEL, MFU_LABEL, MXU_LABEL, percent_text, seconds_text, slice_text, tflops_text
from tpusim.units import format_bytes

if TYPE_CHECKING:
    from tpusim.report.schema import LargestBatch

RECOMPILES_SHOWN = 5


Modes = dict[str, ModeSection]
NO_CACHE = CompileCache(hits=0, misses=0, recompile_count=0, recompiles=[])


def _cache(mode: ModeSection) -> CompileCache:
    """A mode's compile-cache entry; reports written before the cache existed have none."""
    return mode.compile_cache or NO_CACHE


def _steps(mode: ModeSection) -> StepsInfo:
    """A mode's warm-up/steady split; reports written before it existed: the first step as warm-up."""
    count = len(mode.steps_s)
    return mode.steps or StepsInfo(count=count, warmup=min(1, count - 1) if count else 0)


def _headline(mode: ModeSection) -> Headline:
    return mode.headline or Headline()


def _per_second(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _chips(n: int) -> str:
    return f"{n} chip" + ("" if n == 1 else "s")


def step_rows(modes: Modes, names: list[str], partial: bool = False) -> list[tuple[str, list[str]]]:
    """Steps, warm-up and the steady-state median; a run without steps says so; ``partial``: the record budget
    cut the trace before any step, so the "whole program" priced is only its recorded prefix."""
    def median(m: str) -> str:
        return seconds_text(modes[m].step_time_median_s) if _steps(modes[m]).count else "no steps"

    return [
        ("steps (warm-up)", [f"{_steps(modes[m]).count} ({_steps(modes[m]).warmup})" for m in names]),
        ("step time (median)", [median(m) for m in names]),     # of the steady-state steps
        ("first step", [seconds_text(modes[m].first_step_s) for m in names]),
        ("whole program (partial)" if partial else "whole program", [seconds_text(modes[m].total_s) for m in names]),
    ]


def recorded_prefix(report: Report) -> bool:
    """Did the record budget stop recording before any step (the trace only a prefix of the program)?"""
    stopped = report.recording_stopped
    return stopped is not None and not stopped.after_step


def budget_line(report: Report) -> str | None:
    """The record budget's note with what the figures then cover (summary and report.html), else None."""
    stopped = report.recording_stopped
    if stopped is None:
        return None
    covered = "the recorded prefix's, not the whole program's" if recorded_prefix(report) else "the recorded steps'"
    return f"{stopped.note}; the figures are {covered}"


def headline_rows(modes: Modes, names: list[str]) -> list[tuple[str, list[str]]]:
    """The numbers ML engineers compare (tpusim/report/headline.py), for the steady-state step."""
    head = {m: _headline(modes[m]) for m in names}
    rows = []
    if any(h.tokens_per_step for h in head.values()):
        rows += [("tokens/s per slice", [_per_second(head[m].tokens_per_s_per_slice) for m in names]),
                 ("tokens/s per chip", [_per_second(head[m].tokens_per_s_per_chip) for m in names])]
    rows += [("TFLOP/s per chip", [tflops_text(head[m].tflops_per_s_per_chip) for m in names]),
             (HFU_LABEL, [percent_text(modes[m].hfu) for m in names])]
    if any(h.model_flops_utilisation is not None for h in head.values()):
        rows += [(MFU_LABEL, [percent_text(head[m].model_flops_utilisation) for m in names])]
    rows += [("exposed comm share", [percent_text(head[m].exposed_comm_share) for m in names]),
             ("bound by", [head[m].bound or "-" for m in names])]
    return rows


TOTALS = "whole-program totals:"      # a divider row: host dispatch above a step time is no contradiction


def inference_rows(inference: InferenceSection, names: list[str]) -> list[tuple[str, list[str]]]:
    """An inference program's serving numbers per mode (tpusim/report/inference.py); "-" where a mode has none."""
    modes = inference.modes

    def row(label: str, value) -> tuple[str, list[str]]:
        return label, [value(modes[m]) if m in modes else "-" for m in names]

    return [
        row("TTFT (prefill)", lambda m: seconds_text(m.ttft_s)),
        row(f"TPOT median ({inference.decode_steps} steps)", lambda m: seconds_text(m.tpot_median_s)),
        row("TPOT p90", lambda m: seconds_text(m.tpot_p90_s)),
        row("tokens/s per slice", lambda m: _per_second(m.tokens_per_s_per_slice)),
        row("tokens/s per chip", lambda m: _per_second(m.tokens_per_s_per_chip)),
        row("decode HFU", lambda m: percent_text(m.decode.hfu)),
        row("decode HBM utilisation", lambda m: percent_text(m.decode.hbm_utilisation)),
        row("decode bound by", lambda m: m.decode.bound or "-"),
        row("decode compiles/step", lambda m: "-" if m.decode_compiles_per_step is None
            else f"{m.decode_compiles_per_step:.3g}"),
        row("TPOT / HBM roofline", lambda m: "-" if m.roofline_ratio is None else f"{m.roofline_ratio:.3g}x"),
    ]


def inference_lines(inference: InferenceSection | None) -> list[str]:
    """The KV cache, what fits, and each mode's decode verdict."""
    if inference is None:
        return []
    lines = []
    if kv := inference.kv_cache:
        lines.append(f"KV cache: {format_bytes(kv.bytes)} per chip ({'static' if kv.static else 'grown by cat'}, "
                     f"{kv.dtype}): {format_bytes(kv.bytes_per_sequence)} per sequence of {kv.context} tokens, "
                     f"{format_bytes(kv.bytes_per_token)} per token; weights {format_bytes(inference.weights_bytes)}")
    if inference.fits:
        lines.append(f"fits: {inference.fits.line}")
    lines += [f"inference ({name}): {serving_head(mode)}: {mode.verdict}" for name, mode in inference.modes.items()]
    lines += [f"inference ({name}): {line}" for name, mode in inference.modes.items()
              if (line := _collective_line(mode))]
    return lines


def serving_head(mode: InferenceMode) -> str:
    """What an inference verdict leads with: time to first token and per output token."""
    return f"TTFT {seconds_text(mode.ttft_s)}, TPOT {seconds_text(mode.tpot_median_s)}"


def _collective_line(mode: InferenceMode) -> str:
    """Tensor-parallel decode's collectives: their share of a token step and how much of them is latency."""
    share, latency = mode.decode_collective_share, mode.decode_collective_latency_share
    if share is None or latency is None:
        return ""
    kind = "latency-bound" if latency >= 0.5 else "bandwidth-bound"
    return (f"decode collectives: {percent_text(share)} of a token step (exposed), {percent_text(latency)} of their "
            f"time latency ({kind})")


def mode_rows(modes: Modes, names: list[str], partial: bool = False,
              inference: InferenceSection | None = None) -> list[tuple[str, list[str]]]:
    """Every row of the per-mode table, as text: the terminal summary and report.html show the same rows; an
    inference program without training steps shows its phases in place of the step rows."""
    steps = step_rows(modes, names, partial)
    if inference is not None and not any(_steps(modes[m]).count for m in names):
        steps = [*inference_rows(inference, names), steps[-1]]
    elif inference is not None:
        steps += inference_rows(inference, names)
    return [
        *steps,
        *headline_rows(modes, names),
        ("validated error", [_band(modes[m]) for m in names]),
        (TOTALS, [""] * len(names)),      # the rows above are per step (steady state), those below whole-program
        ("kernels", [str(modes[m].kernels) for m in names]),
        ("host dispatch", [seconds_text(modes[m].host_s.dispatch) for m in names]),
        ("host stall", [seconds_text(modes[m].host_s.stall) for m in names]),
        ("host compile", [seconds_text(modes[m].host_s.compile) for m in names]),
        ("compile hits/misses", [f"{_cache(modes[m]).hits}/{_cache(modes[m]).misses}" for m in names]),
        ("recompiles", [_recompiles(modes[m], inference.modes.get(m) if inference else None) for m in names]),
        ("HBM bytes moved", [format_bytes(modes[m].hbm_bytes_moved) for m in names]),
        ("collectives exposed", [seconds_text(modes[m].device_s["collective_exposed"]) for m in names]),
        ("collectives hidden", [seconds_text(modes[m].collective_overlapped_s) for m in names]),
        (MXU_LABEL, [percent_text(modes[m].mxu_utilisation) for m in names]),
        ("HBM peak", [f"{format_bytes(modes[m].hbm.peak_bytes)} "
                      f"({percent_text(modes[m].hbm.peak_fraction)})" for m in names]),
        *offload_rows(modes, names),
        *dcn_rows(modes, names),
        *largest_batch_rows(modes, names),
    ]


LARGEST_BATCH = "largest batch (fits)"


def largest_batch_rows(modes: Modes, names: list[str]) -> list[tuple[str, list[str]]]:
    """--fit-batch ARG (tpusim/run/batch_fit.py), only when asked: the largest value of the script's batch argument
    whose HBM peak fits the chip."""
    if not any(modes[m].largest_batch for m in names):
        return []
    return [(LARGEST_BATCH, [largest_batch_text(modes[m].largest_batch) for m in names])]


def largest_batch_text(fit: LargestBatch | None) -> str:
    """"412 (--batch)"; ">= 65536 (--batch)" where the search stopped before a batch that does not fit."""
    if fit is None:
        return "-"
    return f"{fit_text(fit.value, fit.exact)} ({fit.argument})"


def fit_text(value: int, exact: bool) -> str:
    """A largest batch: 412, or >= 412 when the search stopped before recording one that does not fit."""
    return str(value) if exact else f">= {value}"


def dcn_rows(modes: Modes, names: list[str]) -> list[tuple[str, list[str]]]:
    """The collectives between slices (tpusim/report/dcn.py), only on a multislice run: how many and how much
    they carried, and their time with the part compute did not hide."""
    if not any(modes[m].dcn for m in names):
        return []
    dcns = [modes[m].dcn for m in names]
    return [("DCN collectives", ["-" if d is None else f"{d.collectives} ({format_bytes(d.bytes)})" for d in dcns]),
            ("DCN time (exposed)", ["-" if d is None else f"{seconds_text(d.time_s)} ({seconds_text(d.exposed_s)})"
                                    for d in dcns])]


def priced_by_line(modes: Modes) -> str | None:
    """Who priced the table's compiled programs (the TPU compiler or tpusim's model, as --compiler chose) and the
    validated error band of that path for the fastest mode; None for a run without a priced mode."""
    if not modes:
        return None
    name, mode = min(modes.items(), key=lambda item: item[1].time_s)
    who = "the TPU compiler's programs (XLA)" if mode.compiler == "xla" else "tpusim's model"
    return f"priced by {who}; validated error ({name}): {_band(mode) or 'not recorded (an older report)'}"


def offload_rows(modes: Modes, names: list[str]) -> list[tuple[str, list[str]]]:
    """Activation offload (tpusim/report/offload.py), only when a mode kept activations on the host: the host
    memory they held at most, and the PCIe time with the part compute did not hide."""
    if not any(modes[m].offload for m in names):
        return []
    offloads = [modes[m].offload for m in names]
    return [("host peak (offload)", ["-" if o is None else format_bytes(o.host_peak_bytes) for o in offloads]),
            ("PCIe (exposed)", ["-" if o is None else f"{seconds_text(o.pcie_s)} ({seconds_text(o.pcie_exposed_s)})"
                                for o in offloads])]


def _band(mode: ModeSection) -> str:
    """The mode's validated error band (tpusim/report/fidelity.py); reports before version 6 have none."""
    f = mode.fidelity
    return "" if f is None else band_text(f.validated_as, f.cases, f.mean_abs_error, f.max_abs_error)


def _recompiles(mode: ModeSection, serving: InferenceMode | None) -> str:
    """The recompiles of the step loop, and a decode loop's compiles per token step beside them: a decode loop marks
    no steps, so its every-step compiles are no step-loop recompile, yet they are what bounds it."""
    count = str(_cache(mode).recompile_count)
    per_step = serving.decode_compiles_per_step if serving else None
    return f"{count} (decode: {per_step:.3g}/step)" if per_step and per_step >= 1 else count


def raised_lines(report: Report, out_dir: str) -> list[str]:
    """A script that raised: what was priced of it, in a line, not the cost table (the traceback above is what
    the reader needs; the few ops before the error are in the report)."""
    modes = report.modes
    priced = ", ".join(f"{name} {seconds_text(mode.total_s)}" for name, mode in modes.items()) or "no mode"
    found = len(report.warnings)
    return [f"tpusim: {report.run.script} on {report.run.topology} raised {report.error.type} after "
            f"{report.program.ops} ops and {report.program.collectives} collectives; what ran before it priced: "
            f"{priced}" + (f"; {found} warning{'s' if found != 1 else ''} in the report" if found else ""),
            *largest_batch_lines(modes),      # --fit-batch: most wanted when the batch given ran out of memory
            f"INCOMPLETE: {incomplete_reason(report)}; the report covers what ran before",
            report_line(report, out_dir)]


def largest_batch_lines(modes: Modes) -> list[str]:
    """The largest batch that fits, per mode, in one line where there is no table to hold the row."""
    fits = [f"{name} {largest_batch_text(mode.largest_batch)}" for name, mode in modes.items() if mode.largest_batch]
    return [f"{LARGEST_BATCH}: {', '.join(fits)}"] if fits else []


def _raised(report: Report) -> bool:
    """The script raised (not Ctrl-C or a signal: a stopped run keeps its table of the steps so far)."""
    stopped = report.interrupted is not None and report.interrupted.script
    return report.error is not None and bool(report.error.type) and not stopped


def report_line(report: Report, out_dir: str) -> str:
    """Where the report is; trace.json only when a mode was priced (write_report writes none otherwise: a run
    stopped before pricing said it had, issue 44 E01)."""
    trace = "trace.json for ui.perfetto.dev" if report.modes else "no trace.json: no mode was priced"
    return f"report: {out_dir}/report.html (report.json, {trace})"


def summary_table(report: Report, out_dir: str) -> str:
    if _raised(report):
        return "\n".join(raised_lines(report, out_dir))
    run, modes = report.run, report.modes
    names = list(modes)
    rows = mode_rows(modes, names, recorded_prefix(report), report.inference)
    program = report.program
    ranks = program.ranks_recorded
    per_rank = f" per rank ({ranks} ranks recorded)" if ranks > 1 else ""
    inference = report.inference
    steps = (f"{program.steps} steps" if program.steps
             else f"an inference program: prefill and {inference.decode_steps} decode steps of batch {inference.batch} "
                  f"({inference.phases_from})" if inference is not None
             else "no steps marked (optimizer.step() or tpusim.backend.step() mark them)")
    calibration = report.chip.calibration
    chip = report.chip.display_name + (f", calibrated ({calibration})" if report.chip.calibrated
                                       else ", uncalibrated" if calibration else "")
    lines = [f"tpusim: {run.script} on {slice_text(run.topology, report.slice.slices)} ({chip}, "
             f"{_chips(report.slice.chips)}) - {program.ops} ops, {program.collectives} collectives, "
             f"{steps}{per_rank}"]
    if priced := priced_by_line(modes):
        lines.append(priced)
    if report.slice.shape_note:
        lines.append(f"warning: {report.slice.shape_note}")
    if note := budget_line(report):              # the record budget: the columns price what was recorded
        lines.append(f"note: {note}")
    lines += _columns(names, rows) if names else ["no eager mode was priced"]
    lines += warmup_lines(modes)
    lines += lead_verdicts(modes, inference)
    lines += recompile_lines(modes)
    for warning in report.warnings:
        lines.append(f"warning: {warning.message}" + (f" ({warning.source})" if warning.source else ""))
    reason = incomplete_reason(report)
    if reason:
        lines.append(f"INCOMPLETE: {reason}; the report covers what ran before")
    lines += measured_lines(report)
    lines.append(report_line(report, out_dir))
    return "\n".join(lines)


def verdict_summary(report: Report, out_dir: str) -> str:
    """What ``tpusim check`` prints before its PASS/FAIL lines: the run's first line, each mode's verdict (and an
    inference program's), how many warnings the report holds; the cost table is in the report."""
    if _raised(report):
        return "\n".join(raised_lines(report, out_dir))
    table = summary_table(report, out_dir).splitlines()
    lines = [table[0], *lead_verdicts(report.modes, report.inference), *largest_batch_lines(report.modes)]
    if report.warnings:
        codes = sorted({w.code for w in report.warnings})
        lines.append(f"{len(report.warnings)} warning{'s' if len(report.warnings) != 1 else ''} "
                     f"({', '.join(codes)}): in the report; --fail-on CODE gates them")
    if reason := incomplete_reason(report):
        lines.append(f"INCOMPLETE: {reason}; the report covers what ran before")
    lines.append(table[-1])
    return "\n".join(lines)


def warmup_lines(modes: Modes) -> list[str]:
    """Why each mode's warm-up steps were left out of its median (one line per distinct reason)."""
    lines = []
    for name, mode in modes.items():
        steps = _steps(mode)
        if steps.warmup and steps.reason:
            lines.append(f"warm-up ({name}): {steps.warmup} of {steps.count} steps left out of the median: "
                         f"{steps.reason}")
    return lines


def lead_verdicts(modes: Modes, inference: InferenceSection | None) -> list[str]:
    """The verdicts a reader reads first: an inference program's serving lines (TTFT, TPOT, what bounds a token step)
    before the whole-program verdict, which is left out for a mode that has a decode verdict and marked no steps (the
    whole program is the prefill, the decode loop and their compiles: the decode verdict says it better)."""
    if inference is None:
        return verdict_lines(modes)
    served = {name: mode for name, mode in modes.items()
              if name not in inference.modes or _steps(mode).count}
    return [*inference_lines(inference), *verdict_lines(served)]


def verdict_lines(modes: Modes) -> list[str]:
    """What bounds the step, per mode, with the lint codes that would move it."""
    return [f"verdict ({name}): {_headline(mode).verdict}" for name, mode in modes.items()
            if _headline(mode).verdict]


def _columns(names: list[str], rows: list[tuple[str, list[str]]], title: str = "") -> list[str]:
    """A header of column names, then one line per row: labels left, values right-aligned under them."""
    label_width = max(len(title), *(len(label) for label, _ in rows))
    widths = [max(len(m), *(len(values[i]) for _, values in rows)) for i, m in enumerate(names)]
    lines = [title.ljust(label_width) + "  " + "  ".join(m.rjust(w) for m, w in zip(names, widths))]
    return lines + [(label.ljust(label_width) + "  " + "  ".join(v.rjust(w) for v, w in zip(values, widths))).rstrip()
                    for label, values in rows]


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def measured_lines(report: Report) -> list[str]:
    """--target pjrt: the real wall times per mode and the ratios measured vs simulated (none otherwise)."""
    measured = report.measured
    if not measured:
        return []
    modes = measured.modes
    names = list(modes)
    base = measured.baseline
    lines = [f"measured: each mode run for real on JAX's {measured.device_kind} ({measured.platform}), "
             f"wall time; the prediction above is for {measured.chip}"]
    if names:
        rows: list[tuple[str, list[str]]] = [
            ("step time (median)", [_seconds(modes[m].step_time_median_s) for m in names]),
            ("simulated (median)", [_seconds(modes[m].simulated_step_time_median_s) for m in names]),
            ("first step", [_seconds(modes[m].first_step_s) for m in names]),
            ("whole program", [_seconds(modes[m].total_s) for m in names]),
            ("steps", [str(modes[m].steps) for m in names]),
            (f"vs {base}, measured", [_ratio(modes[m].ratio.measured) for m in names]),
            (f"vs {base}, simulated", [_ratio(modes[m].ratio.simulated) for m in names]),
        ]
        lines += _columns(names, rows)
    for name, mode in modes.items():
        if mode.error:
            lines.append(f"measured {name}: the run failed with {mode.error.type} (exit code "
                         f"{mode.exit_code}); report.json measured.modes.{name}.error")
    lines += [f"note: {note}" for note in measured.notes]
    return lines


def _seconds(value: float | None) -> str:
    return seconds_text(value)


def recompile_lines(modes: Modes) -> list[str]:
    """One line per distinct recompile (source, op, shapes), naming the modes that hit it."""
    seen: dict[tuple, list[str]] = {}
    for name, mode in modes.items():
        for r in _cache(mode).recompiles:
            key = (r.source or "no source", r.op, str(r.old_shapes), str(r.new_shapes))
            seen.setdefault(key, []).append(name)
    lines = [f"recompile: {src}: {op} {old} -> {new} ({', '.join(names)})"
             for (src, op, old, new), names in list(seen.items())[:RECOMPILES_SHOWN]]
    if len(seen) > RECOMPILES_SHOWN:
        lines.append(f"... and {len(seen) - RECOMPILES_SHOWN} more recompiles (report.json modes.*.compile_cache)")
    return lines
