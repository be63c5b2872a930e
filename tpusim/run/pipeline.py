"""The run pipeline: check the input, record the script once, price every eager mode, write the report.

``run_pipeline(RunOptions) -> RunResult`` is what `tpusim run` does (its command line only parses into
``RunOptions``) and what `tpusim check` calls. It is the one place that reaches both layers: it imports
the PyTorch backend lazily (only here), records the script's program trace once, and prices it per eager
mode. With ``--target pjrt`` it also runs the script for real through JAX, once per mode in a fresh
process (tpusim/run/measure.py), and sets the measured step times beside the prediction.

The report's parts are typed values (timelines, ``LintWarning``s, ``Distributed``,
``PlacementComparison``, ``Measured``) handed to ``tpusim.report.build_report`` once, which
turns them into report.json's dict.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tpusim import envvars
from tpusim.errors import TpusimError, plain_text
from tpusim.hardware.calibration import datasheet_chip
from tpusim.output import MANIFEST
from tpusim.report.measured import JaxDevice
from tpusim.run.measure import INTERRUPTED
from tpusim.run.options import RunOptions
from tpusim.run.progress import Progress
from tpusim.script import STOP_SIGNALS, signals_stop_the_script

if TYPE_CHECKING:
    from tpusim.output import EarlierRun, FolderClaim
    from tpusim.report import Measured
    from tpusim.report.schema import Report
    from tpusim.run.batch_fit import Fitter
    from tpusim.trace.records import Trace


@dataclass(frozen=True)
class RunResult:
    """What a run gave: its exit status (as `tpusim run` exits), the report folder and the report written
    there (None when none was), and what ran for real (--target pjrt)."""

    exit_code: int
    out_dir: Path
    report: Report | None
    measured: Measured | None = None


def default_out_dir(script: Path, topology: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("reports") / f"{script.stem}-{topology.replace(':', '_')}-{stamp}"


def run_pipeline(options: RunOptions) -> RunResult:
    """Check the input, run the script once while recording, price every mode, write the report; bad input
    is a TpusimError before the script runs."""
    from tpusim.hardware.spec import default_chip
    from tpusim.placement.parse import parse_placement_text
    from tpusim.pricing import single_chip_topology
    from tpusim.script import check_script
    from tpusim.slice.faults import apply_faults
    from tpusim.slice.topology import build_slice, load_chip_arg

    script = check_script(options.script)
    if options.fit_batch is not None:           # --fit-batch: the script's batch argument, before the script runs
        from tpusim.run.batch_fit import batch_argument

        batch_argument(options.fit_batch, options.script_args)
    if options.compiler == "xla":
        from tpusim.xla.compiler import missing

        why = missing()
        if why:                                  # asked for by name: say so before the script runs
            raise TpusimError(f"--compiler xla: {why}")
    # before the device loads; TPUSIM_CHIP and TPUSIM_NUMERICS too (run sets them from its flags, but a bad value
    # the user set was silently ignored, where the docs say a bad variable stops at once: issue 32, row 10)
    envvars.check()
    progress = Progress(options.quiet)
    device = _jax_device(options, progress) if options.target == "pjrt" else None
    chip_arg, chip_from = _chip_choice(options.chip, device)
    if options.topology is None:
        chip = chip_arg or default_chip().name
        topology = single_chip_topology(load_chip_arg(chip))
    else:
        topology, chip = options.topology, chip_arg
    try:
        # bad topology/chip fails here, before the script runs
        slice_ = build_slice(topology, chip=chip, slices=options.slices, calibrated=options.calibration)
    except TpusimError as error:
        if chip_from != "device":
            raise
        raise TpusimError(f"{error} (chip {chip} is JAX's {device.device_kind}; --chip prices another)") from None
    # a bad --fail-links/--fail-chips fails here too
    slice_ = apply_faults(slice_, options.fail_links, options.fail_chips, options.fault_seed)
    if options.placement is not None:                 # its syntax and axes now; its dims once the mesh is recorded
        parse_placement_text(options.placement, slice_)
    # a folder we can write, no other run writing it
    claim, earlier = _claim_out_dir(options.out, script, slice_.label.replace(" x ", "-x").replace(" ", ""))
    try:
        # absolute from here on: a script that calls os.chdir() must not move its report (issue 32)
        return _record_and_report(options, script, slice_, device, chip_from, claim.folder.absolute(), progress,
                                  earlier)
    finally:
        claim.release()


def _claim_out_dir(out: str | None, script: Path, spec: str) -> tuple[FolderClaim, EarlierRun]:
    """--out checked (a folder, creatable, writable) and claimed for this run before the script runs, with what an
    earlier tpusim run wrote there (its manifest: replaced once this run has written its own files); a folder
    holding files of the names a run writes that no run listed (the user's) is refused. Without --out a fresh
    folder under reports/."""
    from tpusim.output import EarlierRun, claim_folder, claim_new_folder, earlier_run, not_ours, prepare_folder
    from tpusim.report import RUN_FOLDERS, run_files

    if out is None:
        return claim_new_folder(default_out_dir(script, spec)), EarlierRun()
    plain_text(out, "--out", "give a folder for the report, e.g. reports/my-run", max_length=4096, ascii_only=False)
    if not out.strip():                     # '' would be the current folder: the report among the user's files
        raise TpusimError("--out '' names no folder; give a folder for the report, e.g. reports/my-run")
    claim = claim_folder(prepare_folder(out))
    earlier = earlier_run(claim.folder, run_files(), RUN_FOLDERS)
    theirs = not_ours(claim.folder, run_files(), earlier)
    if theirs:                              # tpusim never replaces a file it did not write (issue 44)
        claim.release()
        raise TpusimError(_not_ours_message(out, theirs))
    return claim, earlier


def _not_ours_message(out: str, names: list[str]) -> str:
    shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
    return (f"--out {out!r} holds {shown}, which no tpusim run wrote there (a run lists its files in "
            f"{MANIFEST}, and replaces only those); move them, or give another --out")


def _record_and_report(options: RunOptions, script: Path, slice_, device: JaxDevice | None, chip_from: str,
                       out_dir: Path, progress: Progress, earlier: EarlierRun) -> RunResult:
    """Run the script once, recording; then price, report, and return the exit status. Whatever happens after the
    script ran, what this run wrote replaces the earlier run's files in ``out_dir`` (``_finish_folder``)."""
    chips = f"{slice_.total_chips} chip{'' if slice_.total_chips == 1 else 's'}"
    progress.say(f"running {script.name} on {slice_.label} ({slice_.chip.display_name}, {chips}), "
                 f"numerics {options.numerics}")
    backend = _import_backend()
    settings: dict[str, object] = {"chip": datasheet_chip(slice_.chip), "numerics": options.numerics != "off",
                                   "tpu_numerics": options.numerics == "tpu"}
    settings["topology"] = slice_.dims      # torch.tpu.topology_aware_mesh & co. see the --topology slice
    if device is not None:                   # record on the simulator; JAX's device stays free for the real runs
        settings["target"] = "sim"
    if len(options.modes) == 1:                      # the script runs in the one mode priced (tpusim/eager/state.py)
        settings["eager_mode"] = options.modes[0].name
    from tpusim.xla.programs import use_compiler

    settings["op_programs"] = use_compiler(options.compiler)   # the recording keeps each eager op's program
    backend.configure(backend.load_config(**settings))   # the rest (TPUSIM_F64, ...) from the environment
    os.environ["TPUSIM_NUMERICS"] = options.numerics  # for the script only: examples/*.py print no values when off
    from tpusim.backend.distributed import runner
    from tpusim.output import temporary_name

    ranks = runner.resolve_ranks(options.ranks, slice_.total_chips, script)
    ranks_dir = None
    if ranks == "all":                       # each rank's trace: staged, then ranks/ once the report is written
        _check_ranks_folder(out_dir, earlier, options.out)
        ranks_dir = temporary_name(out_dir / RANKS)
    try:
        return _record_and_price(options, script, slice_, device, chip_from, out_dir, progress, ranks_dir)
    finally:
        _finish_folder(out_dir, earlier, ranks_dir, options.out)


def _record_and_price(options: RunOptions, script: Path, slice_, device: JaxDevice | None, chip_from: str,
                      out_dir: Path, progress: Progress, ranks_dir: Path | None) -> RunResult:
    """Record the script (``ranks_dir``: --ranks all, each rank's trace there), keep the recording, price it and
    write the report."""
    import torch

    import tpusim.backend as backend
    from tpusim.backend.distributed import runner
    from tpusim.script import run_script

    started = time.perf_counter()
    budget_stop = None                       # set when the record budget stopped recording
    fit = _batch_fitter(options, script, slice_, progress)
    if ranks_dir is not None:
        progress.say(f"--ranks all: {slice_.total_chips} processes, one per chip")
        with signals_stop_the_script():     # SIGTERM, SIGHUP: every rank stops as at Ctrl-C (issue 32, row 1)
            trace, outcome, budget_stop = runner.record_all(script, list(options.script_args), slice_.total_chips,
                                                            slice_.chip.chips_per_host, ranks_dir,
                                                            options.max_records)
    else:
        runner.prepare_one(slice_.total_chips, slice_.chip.chips_per_host)
        with backend.recording(max_records=options.max_records) as recorder:
            progress.track(f"recording {script.name}", lambda: len(recorder.records), unit="records")
            try:
                with signals_stop_the_script():     # SIGTERM, SIGHUP: the script stops as at Ctrl-C
                    outcome = run_script(script, list(options.script_args))
            finally:
                progress.stop()
        trace = runner.ranks_one_meta(dataclasses.replace(recorder.trace, world_size=slice_.total_chips))
        budget_stop = _budget_stop(recorder)
    with Interrupts(progress) as interrupts:    # from here on Ctrl-C never loses what was recorded
        from tpusim.placement import apply_placement
        placement_error = None
        try:
            trace = apply_placement(trace, slice_, options.placement)
        except TpusimError as error:        # the recorded mesh does not match: report with the default placement
            placement_error = error
        if outcome.error:
            print(outcome.error, file=sys.stderr, end="")
        progress.say(f"recorded {len(trace.records)} records in {time.perf_counter() - started:.1f} s; "
                     f"pricing {', '.join(options.mode_names)}")
        measure = None
        if device is not None and outcome.exit_code != INTERRUPTED:
            measure = _measurer(script, options, slice_, device, chip_from, progress)
        _keep_recording(trace, out_dir)      # before pricing: whatever pricing does, the recording is kept
        try:
            report, measured, stopped = _price_and_report(trace, slice_, options, outcome, torch.__version__,
                                                          out_dir, progress, interrupts, measure, budget_stop, fit)
        except TpusimError:
            raise
        except Exception as error:           # a tpusim bug while pricing: one line, the traceback kept beside
            _pricing_failed(error, out_dir)
            return RunResult(outcome.exit_code or 1, out_dir, None)
    if placement_error is not None:
        print(f"tpusim run: error: {placement_error} (the report uses the default placement)", file=sys.stderr)
    measured_codes = [run.exit_code for run in (measured.runs if measured else ())]
    code = (outcome.exit_code or (interrupts.exit_code if stopped else 0) or (2 if placement_error else 0)
            or next((code for code in measured_codes if code), 0))
    return RunResult(code, out_dir, report, measured)


RANKS = "ranks"                             # --ranks all: each rank's trace (report.RUN_FOLDERS)


def _check_ranks_folder(out_dir: Path, earlier: EarlierRun, out: str | None) -> None:
    """--ranks all writes each rank's trace to ``ranks/``: refused before the script runs when a ``ranks``
    there is the user's (no tpusim run listed it)."""
    from tpusim.output import not_ours

    if not_ours(out_dir, (RANKS,), earlier):
        raise TpusimError(_not_ours_message(out or str(out_dir), [RANKS + "/"]))


def _keep_recording(trace: Trace, out_dir: Path) -> None:
    """program.jsonl, written before pricing so that nothing pricing does loses the recording."""
    from tpusim.trace.records import write_trace

    try:
        write_trace(trace, out_dir / "program.jsonl")
    except OSError as error:                 # a full disk, the folder removed while the script ran, ...
        raise _cannot_write(out_dir, error) from None


def _cannot_write(out_dir: Path, error: OSError) -> TpusimError:
    return TpusimError(f"cannot write the report to {str(out_dir)!r}: {error.strerror or error}"
                       f"{f' ({error.filename})' if error.filename else ''}")


def _pricing_failed(error: Exception, out_dir: Path) -> None:
    """Pricing raised (a tpusim bug, or an input it cannot price): one line says so and what was kept; the
    traceback goes to pricing-error.txt beside the recording, for a bug report."""
    import traceback

    from tpusim.output import write_atomic
    from tpusim.report import PRICING_ERROR

    where = ""
    with contextlib.suppress(OSError):
        write_atomic(out_dir / PRICING_ERROR, "".join(traceback.format_exception(error)))
        where = f"; the traceback in {out_dir / PRICING_ERROR}"
    what = _one_line(error)
    print(f"tpusim run: error: pricing failed ({type(error).__name__}: {what}); the recording is kept in "
          f"{out_dir / 'program.jsonl'}{where}; no report was written", file=sys.stderr)


def _one_line(error: Exception) -> str:
    """An exception's message on one line, at most 300 characters."""
    text = " ".join(str(error).split())
    return text if len(text) <= 300 else text[:297] + "..."


def _finish_folder(out_dir: Path, earlier: EarlierRun, ranks_dir: Path | None, out: str | None) -> None:
    """What this run wrote replaces what the earlier run in ``out_dir`` wrote (tpusim/output.py: only what its
    manifest lists, and only once this run has written its own), the staged ranks' traces become ``ranks/``,
    and the manifest lists this run's files; says so when an earlier run's report was replaced."""
    from tpusim.output import finish_run, move_into_place
    from tpusim.report import run_files

    folders: tuple[str, ...] = ()
    try:
        if ranks_dir is not None and ranks_dir.is_dir():
            if move_into_place(ranks_dir, out_dir, RANKS, earlier):
                folders = (RANKS,)
            else:                            # a ranks/ of the user's appeared (or was filled) while the script ran
                print(f"tpusim: --out {out}: ranks/ holds files no tpusim run wrote; each rank's trace is in "
                      f"{ranks_dir.name} there", file=sys.stderr)
        replaced = finish_run(out_dir, earlier, run_files(), folders)
    except OSError as error:
        print(f"tpusim: --out {out or out_dir}: could not tidy the folder: {error.strerror or error}",
              file=sys.stderr)
        return
    if replaced:
        print(f"tpusim: --out {out}: replaced an earlier run's report ({', '.join(replaced)})", file=sys.stderr)


def _budget_stop(recorder):
    """The report's ``recording_stopped`` when the record budget stopped ``recorder``
    (tpusim/backend/program_trace/recorder.py), else None."""
    from tpusim.backend.program_trace.recorder import budget_note
    from tpusim.report.model import RecordingStopped

    if recorder.stopped_after_step is None:
        return None
    return RecordingStopped(recorder.stopped_after_step, recorder.steps, recorder.max_records,
                            budget_note(recorder.stopped_after_step, recorder.steps, recorder.max_records,
                                        recorder.kept), recorder.kept)


def _batch_fitter(options: RunOptions, script: Path, slice_, progress: Progress) -> Fitter | None:
    """--fit-batch ARG: what searches the largest batch once the run is priced (tpusim/run/batch_fit.py), made before
    the script runs (it keeps the folder and environment the run started in); None without the flag."""
    if options.fit_batch is None:
        return None
    from tpusim.run.batch_fit import Fitter

    return Fitter(options, script, options.chip or slice_.chip.name, slice_.chip.hbm_bytes, progress)


def _jax_device(options: RunOptions, progress: Progress) -> JaxDevice:
    """--target pjrt: check it can work before anything slow runs, and ask JAX for its device."""
    from tpusim.run.measure import probe_device, require_jax

    require_jax()
    if options.numerics == "off":
        raise TpusimError("--numerics off computes no values, so nothing could run for real: "
                          "--target pjrt needs --numerics on")
    progress.say("asking JAX for its device")
    device = probe_device(options.pjrt_timeout_s)
    progress.say(f"JAX device: {device.device_kind} ({device.platform}), jax {device.jax_version}")
    return device


def _chip_choice(chip: str | None, device: JaxDevice | None) -> tuple[str | None, str]:
    """The chip to price on and why: --chip, else the chip of JAX's TPU, else the default (None here)."""
    from tpusim.hardware.spec import chip_for_device_kind

    if chip:
        return chip, "--chip"
    found = chip_for_device_kind(device.device_kind) if device is not None and device.is_tpu else None
    return (found.name, "device") if found else (None, "default")


def _measurer(script: Path, options: RunOptions, slice_, device: JaxDevice, chip_from: str,
              progress: Progress) -> Callable[[], Measured]:
    """What runs each mode for real once the prediction is priced (the report's ``measured`` section)."""
    from tpusim.pricing.timeline import step_stats
    from tpusim.report import Measured
    from tpusim.run.measure import measure_mode
    from tpusim.units import format_seconds

    def measure() -> Measured:
        runs = []
        for mode in options.mode_names:
            progress.say(f"measuring {mode}: {script.name} runs for real on JAX's {device.device_kind} "
                         f"({device.platform}) in a fresh process")
            run = measure_mode(script, list(options.script_args), mode, chip=datasheet_chip(slice_.chip),
                               world=slice_.total_chips, chips_per_host=slice_.chip.chips_per_host,
                               timeout_s=options.pjrt_timeout_s)
            runs.append(run)
            step = step_stats(run.steps_s, run.total_s).median_s
            progress.say(f"measured {mode}: {len(run.steps_s)} steps, median step "
                         f"{format_seconds(step) if step is not None else '-'}"
                         + (f"; it failed with {run.error_type}" if run.error_type else ""))
            if run.exit_code == INTERRUPTED:
                break
        return Measured(device, slice_.chip.name, chip_from, tuple(runs))

    return measure


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Ctrl-C, SIGTERM and SIGHUP wait until the block ends (a fraction of a second), then arrive as usual:
    their handlers only note them meanwhile (a signal mask would not do: another thread of the process would
    take the signal, and Python raises it in the main thread all the same)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []
    previous = {signum: signal.signal(signum, lambda signum, frame: noted.append(signum))
                for signum in (signal.SIGINT, *STOP_SIGNALS) if signal.getsignal(signum) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if noted:
            signal.raise_signal(noted[0])   # now, to the handler in place


def _import_backend():
    # numpy first, whole: a Ctrl-C while torch imported it was swallowed by an import guard and left numpy
    # half-initialised (the report then died in matplotlib; issue 32, row 8); held, it arrives right after
    with _signals_held():
        import numpy  # noqa: F401
    try:
        import torch  # noqa: F401  (first: torch's autoload entry point then registers the device)

        import tpusim.backend as backend
    except TpusimError as error:
        raise TpusimError(f"the tpu device could not be loaded: {error}") from None
    except Exception as error:  # ImportError, the shim's build failing, torch's autoload wrapping either
        cause = error.__cause__ or error
        raise TpusimError(f"the tpu device could not be loaded: {type(cause).__name__}: {cause}") from None
    return backend


class Interrupts:
    """Ctrl-C (or SIGTERM, SIGHUP: a cancelled CI job, docker stop, Slurm) once the script has ended: while
    ``stoppable`` work runs (pricing, placements, measuring) it stops that work and the report covers what
    was done; at any other time (writing the report) it prints one line and no stoppable work starts after
    it; so any number of signals never loses the report. The previous handlers are back on exit. (While the
    script runs, the signals are the script's: tpusim/script.py.)"""

    SIGNALS = {signal.SIGINT: "Ctrl-C", **STOP_SIGNALS}

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.stopped = False                # a signal stopped some work
        self.by = "Ctrl-C"                  # the first signal that did
        self.signum = int(signal.SIGINT)    # and its number (the exit status is the shell's: 128 + it)
        self._stoppable = False
        self._told = False
        self._previous: dict[int, object] = {}

    def __enter__(self) -> Interrupts:
        # not outside the main thread (Python delivers signals there only), nor for a signal ignored on
        # purpose (started with SIGINT ignored: nohup, a background job of a script)
        if threading.current_thread() is threading.main_thread():
            for signum in self.SIGNALS:
                if signal.getsignal(signum) is not signal.SIG_IGN:
                    self._previous[signum] = signal.signal(signum, self._pressed)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _pressed(self, signum: int, frame: object) -> None:
        if not self.stopped:
            self.by, self.signum = self.SIGNALS[signum], int(signum)
        if self._stoppable:
            self._stoppable = False
            self.stopped = True
            raise KeyboardInterrupt
        self.stopped = True                 # no stoppable work starts after this signal
        if not self._told:
            self._told = True
            name = self.SIGNALS[signum]
            message = f"\ntpusim: {name}: writing the report of what was done first ({name} again changes nothing)"
            try:
                print(message, file=sys.stderr, flush=True)
            except RuntimeError:            # the signal landed inside a print to stderr ("reentrant call")
                with contextlib.suppress(OSError):
                    os.write(2, (message + "\n").encode())

    @property
    def exit_code(self) -> int:
        """The exit status of a run a signal stopped, as the shell reports it: 130, 143 (SIGTERM), 129 (SIGHUP)."""
        return 128 + self.signum

    def stoppable(self, work: Callable[[], None]) -> bool:
        """Run ``work``; False when Ctrl-C stopped it (then nothing after it is stoppable either)."""
        if self.stopped:
            return False
        self._stoppable = True
        try:
            work()
            return True
        except KeyboardInterrupt:
            self.stopped = True
            return False
        finally:
            self._stoppable = False


def _price_and_report(trace, slice_, options: RunOptions, outcome, torch_version, out_dir, progress,
                      interrupts: Interrupts, measure: Callable[[], Measured] | None = None,
                      recording_stopped=None, fit: Fitter | None = None) -> tuple[Report, Measured | None, bool]:
    """Price every mode, build the report from its typed parts (plus what ``measure`` finds for real), write
    it, print the summary; returns the report, what was measured and whether Ctrl-C stopped pricing."""
    modes = options.modes
    from tpusim.placement import compare, distributed_info
    from tpusim.pricing import price
    from tpusim.pricing.compiled import ask_compiler, compiler_output
    from tpusim.report import Interrupted, RunInfo, build_report, summary_table, write_report
    from tpusim.report.faults import slowdown_lines, slowdown_section
    from tpusim.report.lint import lint
    from tpusim.report.placements import format_placements
    from tpusim.report.summary import verdict_summary
    from tpusim.report.xla import xla_lines
    from tpusim.run import notices
    from tpusim.xla.compiler import missing

    timelines = {}
    doing = ["pricing before it began"]        # what a signal stopped, for the line that says so
    xla = None

    def estimate() -> None:                   # XLA compiles in a process of its own: a signal stops it too
        nonlocal xla
        doing[0] = "asking the TPU compiler"
        xla = ask_compiler(trace, slice_.chip, options.compiler, progress)   # it counts XLA's compiles

    xla_done = interrupts.stoppable(estimate)
    # XLA's kernels price its programs, and each eager op (Strict, Debug) or eager cluster (Fused) it compiled
    compiled = compiler_output(xla)
    by_name = {mode.name: mode for mode in modes}

    def price_modes() -> None:
        progress.steps("pricing", len(modes), unit="modes")
        try:
            for mode in modes:
                doing[0] = f"pricing mode {mode.name}"
                began = time.perf_counter()
                timelines[mode.name] = price(trace, topology=slice_, mode=mode, compiled=compiled)
                progress.say(f"priced {mode.name}: {timelines[mode.name].total_s:.6g} s simulated in "
                             f"{time.perf_counter() - began:.1f} s")
                progress.advance()
        finally:
            progress.stop()

    priced = interrupts.stoppable(price_modes) and xla_done
    if not priced:
        progress.say(f"{interrupts.by}: stopped {doing[0]}; the recording is kept in {out_dir / 'program.jsonl'}; "
                     f"the report covers the modes priced: {', '.join(timelines) or 'none'}")
    fastest = min(timelines, key=lambda mode: timelines[mode].total_s) if timelines else None
    placements = measured = None
    if options.compare_placements and fastest is not None:
        def price_placements() -> None:
            nonlocal placements
            placements = compare(trace, slice_,
                                 lambda t, s: price(t, topology=s, mode=by_name[fastest], compiled=compiled))
        priced = interrupts.stoppable(price_placements) and priced
    if measure is not None and priced:
        def run_measured() -> None:
            nonlocal measured
            measured = measure()
        interrupts.stoppable(run_measured)
    script_by = {"KeyboardInterrupt": "Ctrl-C", **{name: name for name in STOP_SIGNALS.values()}}
    script_stopped = outcome.error_type in script_by
    by = script_by[outcome.error_type] if script_stopped else interrupts.by
    largest = fit_error = None
    if fit is not None and timelines:        # --fit-batch: the script recorded again at other batches
        def search() -> None:
            nonlocal largest
            largest = fit(list(timelines), outcome)
        try:
            interrupts.stoppable(search)
        except TpusimError as error:         # it failed at a batch, not for memory: said once the report is written
            fit_error = error
    interrupted = (Interrupted(script=script_stopped, pricing=not priced, by=by,
                               not_priced=tuple(m for m in options.mode_names if m not in timelines))
                   if script_stopped or not priced else None)
    info = RunInfo(script=options.script, argv=options.script_args, topology=slice_.spec,
                   numerics=options.numerics, target=options.target, torch_version=torch_version,
                   error_type=outcome.error_type, error_traceback=outcome.error, exit_code=outcome.exit_code,
                   interrupted=interrupted, tokens_per_step=options.tokens_per_step,
                   recording_stopped=recording_stopped)
    warnings = lint(trace, slice_.chip, timelines[fastest] if fastest else None)
    distributed = distributed_info(trace, slice_)
    faults = None
    if slice_.faults and timelines:          # the slowdown against the healthy slice, per mode priced
        healthy = {mode: price(trace, topology=slice_.healthy, mode=by_name[mode], compiled=compiled)
                   for mode in timelines}
        faults = slowdown_section(slice_, timelines, healthy)
    report = build_report(info, trace, slice_, timelines, warnings, distributed=distributed, placements=placements,
                          measured=measured, faults=faults, xla=xla, largest_batch=largest)
    try:
        write_report(out_dir, report, timelines)
    except OSError as error:                 # a full disk, the folder removed while the script ran, ...
        raise _cannot_write(out_dir, error) from None
    print(summary_table(report, str(out_dir)) if options.table else verdict_summary(report, str(out_dir)))
    for line in slowdown_lines(faults):
        print(line)
    print(format_placements(distributed, placements), end="")
    for line in notices.once(xla_lines(report), missing(), "xla-extra-missing"):   # the advice once per machine
        print(line)
    if fit_error is not None:
        raise fit_error
    return report, measured, not priced
