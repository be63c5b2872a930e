"""``tpusim run SCRIPT``: run a PyTorch script on the simulated slice and write its cost report.

The one command that reaches both layers: it imports the PyTorch backend lazily (only
here), records the script's program trace once, and prices it per eager mode. With
``--target pjrt`` it also runs the script for real through JAX, once per mode in a fresh
process (tpusim/run/measure.py), and sets the measured step times beside the prediction.

The report's parts are typed values (timelines, ``LintWarning``s, ``Distributed``,
``PlacementComparison``, ``Measured``) handed to ``tpusim.report.build_report`` once, which
turns them into report.json's dict.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from tpusim import envvars
from tpusim.errors import TpusimError, plain_text
from tpusim.report.measured import JaxDevice
from tpusim.run.measure import INTERRUPTED
from tpusim.run.progress import Progress

if TYPE_CHECKING:
    from tpusim.report import Measured

EXAMPLES = """\
The script runs unchanged as __main__ with its own arguments (after --); its tensors on
device "tpu" live on the simulated chip. Steps are counted at optimizer.step() or at an
explicit tpusim.backend.step().

examples:
  python -m tpusim run examples/mlp.py                          # one v5p chip, strict mode
  python -m tpusim run examples/transformer.py --topology 3d:8x8x8 --mode all
  python -m tpusim run examples/transformer.py --numerics off -- --layers 24 --d-model 2048
  python -m tpusim run examples/dlrm.py --chip v5e --topology 2d:4x4 --out reports/dlrm-v5e
  python -m tpusim run examples/mlp.py --target pjrt --mode all # also run each mode for real through JAX

--target pjrt (needs pip install -e ".[pjrt]"): after pricing, each mode runs the script for real
on JAX's default device (a TPU where JAX sees one, else its CPU or GPU), in a fresh process with
TPUSIM_TARGET=pjrt and nothing recorded; the report's `measured` section and the summary set its
wall time per step beside the prediction. On a TPU the prediction is for that chip (unless --chip);
elsewhere compare the ratios between modes, not the absolute times.

What it writes (in --out, default reports/<script>-<topology>-<time>/):
  report.json   the versioned cost report (the contract; see tpusim/report/model.py)
  report.html   one self-contained page with the figures; *.png the figures alone
  trace.json    Chrome/Perfetto trace of the fastest mode (open in ui.perfetto.dev)
  program.jsonl the recorded program trace, to re-price without re-running
"""


def add_parser(subparsers) -> None:
    from tpusim.eager.modes import DEFAULT_MODE, MODES
    from tpusim.slice.faults import add_fault_arguments

    parser = subparsers.add_parser(
        "run", help="run a PyTorch script on a simulated TPU slice and report what it would cost",
        description="Run SCRIPT with its tensors on the simulated 'tpu' device and write a cost report.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("script", metavar="SCRIPT", help="the Python file to run, e.g. examples/mlp.py")
    parser.add_argument("--topology", metavar="SPEC",
                        help="slice shape, e.g. 3d:8x8x8 or 2d:16x16 (default: a single chip)")
    parser.add_argument("--chip", help="chip generation, e.g. v5p, v6e (default: by topology; v5p alone)")
    parser.add_argument("--mode", default=DEFAULT_MODE,
                        help=f"eager mode(s) to price: {', '.join(MODES)}, a comma list, or all "
                             f"(default {DEFAULT_MODE}); one recording is priced per mode")
    parser.add_argument("--numerics", choices=("on", "off"), default="on",
                        help="off: shape-only run (no tensor memory; prices models larger than this "
                             "machine; reading values is an error)")
    parser.add_argument("--out", metavar="DIR", help="report folder (default reports/<script>-<topology>-<time>)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines, only the final summary")
    parser.add_argument("--ranks", choices=("auto", "one", "all"), default="auto",
                        help="one: this process is rank 0 of the whole world (collectives by the symmetry "
                             "rule); all: one process per chip, data really moves, hangs are diagnosed "
                             "(auto: all for 2..16 chips when the script uses torch.distributed, else one)")
    parser.add_argument("--placement", metavar="MAP",
                        help="DeviceMesh dims -> torus axes, e.g. 'tp=x,fsdp=yz' (default: innermost dim on x, "
                             "then y, z)")
    parser.add_argument("--compare-placements", action="store_true",
                        help="also price every distinct placement of the DeviceMesh, ranked by step time")
    parser.add_argument("--target", choices=("sim", "pjrt"), default="sim",
                        help="sim: the prediction only (default); pjrt: also run the script for real through "
                             "JAX, one fresh process per mode, and report measured step times beside the "
                             "prediction (priced on JAX's TPU chip unless --chip)")
    parser.add_argument("--pjrt-timeout", type=float, default=3600.0, metavar="S",
                        help="--target pjrt: stop a measured run after S seconds (default 3600; 0: never)")
    parser.add_argument("--tokens-per-step", type=_tokens_per_step, metavar="N",
                        help="tokens one step processes over the whole slice (global batch x sequence length): "
                             "the report then gives tokens/s per chip and per slice")
    parser.add_argument("--max-records", type=_max_records, metavar="N",
                        help="record budget: once a step ends with N records recorded, recording stops (the "
                             "script runs on; the report prices the steps recorded and says so); before any "
                             "step, it stops at exactly N records (the report prices that prefix); per rank "
                             "with --ranks all; default TPUSIM_MAX_RECORDS or 6e5 (under 2 GB), 0: no limit")
    add_fault_arguments(parser)
    parser.set_defaults(run=run, script_args=[])


def _max_records(text: str) -> int:
    """--max-records: read as TPUSIM_MAX_RECORDS is (tpusim/envvars.py), else argparse's clear error."""
    try:
        return int(envvars.BY_NAME["TPUSIM_MAX_RECORDS"].parse(text))
    except (ValueError, OverflowError, TpusimError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of records >= 0, e.g. 2e6 "
                                         f"(0: no limit)") from None


def _tokens_per_step(text: str) -> int:
    """--tokens-per-step: a positive whole number, else argparse's clear error."""
    if not (text.isascii() and text.strip().isdigit()) or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number of tokens, e.g. 8192 "
                                         f"(global batch 8 x sequence 1024)")
    return int(text)


def default_out_dir(script: Path, topology: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("reports") / f"{script.stem}-{topology.replace(':', '_')}-{stamp}"


def run(args: argparse.Namespace) -> int:
    from tpusim.eager.modes import resolve_modes
    from tpusim.hardware.spec import default_chip
    from tpusim.placement.parse import parse_placement_text
    from tpusim.pricing import single_chip_topology
    from tpusim.script import check_script
    from tpusim.slice.faults import apply_faults, fault_args
    from tpusim.slice.topology import build_slice, load_chip_arg

    script = check_script(args.script)
    envvars.check(skip=("TPUSIM_CHIP", "TPUSIM_NUMERICS"))   # before the device loads (run sets these two)
    modes = resolve_modes(args.mode)
    progress = Progress(args.quiet)
    device = _jax_device(args, progress) if args.target == "pjrt" else None
    chip_arg, chip_from = _chip_choice(args.chip, device)
    if args.topology is None:
        chip = chip_arg or default_chip().name
        topology = single_chip_topology(load_chip_arg(chip))
    else:
        topology, chip = args.topology, chip_arg
    try:
        slice_ = build_slice(topology, chip=chip)  # bad topology/chip fails here, before the script runs
    except TpusimError as error:
        if chip_from != "device":
            raise
        raise TpusimError(f"{error} (chip {chip} is JAX's {device.device_kind}; --chip prices another)") from None
    slice_ = apply_faults(slice_, *fault_args(args))   # a bad --fail-links/--fail-chips fails here too
    if args.placement is not None:                 # its syntax and axes now; its dims once the mesh is recorded
        parse_placement_text(args.placement, slice_)
    claim = _claim_out_dir(args.out, script, slice_.spec)  # a folder we can write, and no other run writing it
    try:
        return _record_and_report(args, script, modes, slice_, device, chip_from, claim.folder, progress)
    finally:
        claim.release()


def _claim_out_dir(out: str | None, script: Path, spec: str):
    """--out checked (a folder, creatable, writable) and claimed for this run before the script runs; without
    --out a fresh folder under reports/."""
    from tpusim.output import claim_folder, claim_new_folder, prepare_folder

    if out is None:
        return claim_new_folder(default_out_dir(script, spec))
    plain_text(out, "--out", "give a folder for the report, e.g. reports/my-run", max_length=4096, ascii_only=False)
    return claim_folder(prepare_folder(out))


def _record_and_report(args: argparse.Namespace, script: Path, modes: list[str], slice_, device: JaxDevice | None,
                       chip_from: str, out_dir: Path, progress: Progress) -> int:
    """Run the script once, recording; then price, report, and return the exit status."""
    progress.say(f"running {script.name} on {slice_.spec} ({slice_.chip.display_name}, "
                 f"{slice_.total_chips} chip{'' if slice_.total_chips == 1 else 's'}), numerics {args.numerics}")
    backend = _import_backend()
    settings: dict[str, object] = {"chip": slice_.chip, "numerics": args.numerics == "on"}
    settings["topology"] = slice_.dims      # torch.tpu.topology_aware_mesh & co. see the --topology slice
    if device is not None:                   # record on the simulator; JAX's device stays free for the real runs
        settings["target"] = "sim"
    if len(modes) == 1:                      # the script runs in the one mode priced (tpusim/eager/state.py)
        settings["eager_mode"] = modes[0]
    backend.configure(backend.load_config(**settings))   # the rest (TPUSIM_F64, ...) from the environment
    os.environ["TPUSIM_NUMERICS"] = args.numerics  # for the script only: examples/*.py print no values when off
    import torch

    from tpusim.backend.distributed import runner
    from tpusim.script import run_script
    ranks = runner.resolve_ranks(args.ranks, slice_.total_chips, script)
    started = time.perf_counter()
    budget_stop = None                       # set when the record budget stopped recording
    if ranks == "all":
        progress.say(f"--ranks all: {slice_.total_chips} processes, one per chip")
        trace, outcome, budget_stop = runner.record_all(script, list(args.script_args), slice_.total_chips,
                                                        slice_.chip.chips_per_host, out_dir,
                                                        getattr(args, "max_records", None))
    else:
        runner.prepare_one(slice_.total_chips, slice_.chip.chips_per_host)
        with backend.recording(max_records=getattr(args, "max_records", None)) as recorder:
            progress.track(f"recording {script.name}", lambda: len(recorder.records), unit="records")
            try:
                outcome = run_script(script, list(args.script_args))
            finally:
                progress.stop()
        trace = runner.ranks_one_meta(dataclasses.replace(recorder.trace, world_size=slice_.total_chips))
        budget_stop = _budget_stop(recorder)
    with Interrupts(progress) as interrupts:    # from here on Ctrl-C never loses what was recorded
        from tpusim.placement import apply_placement
        placement_error = None
        try:
            trace = apply_placement(trace, slice_, args.placement)
        except TpusimError as error:        # the recorded mesh does not match: report with the default placement
            placement_error = error
        if outcome.error:
            print(outcome.error, file=sys.stderr, end="")
        progress.say(f"recorded {len(trace.records)} records in {time.perf_counter() - started:.1f} s; "
                     f"pricing {', '.join(modes)}")
        measure = None
        if device is not None and outcome.exit_code != INTERRUPTED:
            measure = _measurer(script, args, modes, slice_, device, chip_from, progress)
        measured, stopped = _price_and_report(trace, slice_, modes, script, args, outcome, torch.__version__,
                                              out_dir, progress, interrupts, measure, budget_stop)
    if placement_error is not None:
        print(f"tpusim run: error: {placement_error} (the report uses the default placement)", file=sys.stderr)
    measured_codes = [run.exit_code for run in (measured.runs if measured else ())]
    return (outcome.exit_code or (INTERRUPTED if stopped else 0) or (2 if placement_error else 0)
            or next((code for code in measured_codes if code), 0))


def _budget_stop(recorder):
    """The report's ``recording_stopped`` when the record budget stopped ``recorder`` (tpusim/backend/recorder.py),
    else None."""
    from tpusim.backend.recorder import budget_note
    from tpusim.report.model import RecordingStopped

    if recorder.stopped_after_step is None:
        return None
    return RecordingStopped(recorder.stopped_after_step, recorder.steps, recorder.max_records,
                            budget_note(recorder.stopped_after_step, recorder.steps, recorder.max_records,
                                        recorder.kept), recorder.kept)


def _jax_device(args: argparse.Namespace, progress: Progress) -> JaxDevice:
    """--target pjrt: check it can work before anything slow runs, and ask JAX for its device."""
    from tpusim.run.measure import probe_device, require_jax

    require_jax()
    if args.numerics == "off":
        raise TpusimError("--numerics off computes no values, so nothing could run for real: "
                          "--target pjrt needs --numerics on")
    progress.say("asking JAX for its device")
    device = probe_device(args.pjrt_timeout or None)
    progress.say(f"JAX device: {device.device_kind} ({device.platform}), jax {device.jax_version}")
    return device


def _chip_choice(chip: str | None, device: JaxDevice | None) -> tuple[str | None, str]:
    """The chip to price on and why: --chip, else the chip of JAX's TPU, else the default (None here)."""
    from tpusim.hardware.spec import chip_for_device_kind

    if chip:
        return chip, "--chip"
    found = chip_for_device_kind(device.device_kind) if device is not None and device.is_tpu else None
    return (found.name, "device") if found else (None, "default")


def _measurer(script: Path, args: argparse.Namespace, modes: list[str], slice_, device: JaxDevice, chip_from: str,
              progress: Progress) -> Callable[[], Measured]:
    """What runs each mode for real once the prediction is priced (the report's ``measured`` section)."""
    from tpusim.pricing.timeline import step_stats
    from tpusim.report import Measured
    from tpusim.run.measure import measure_mode
    from tpusim.units import format_seconds

    def measure() -> Measured:
        runs = []
        for mode in modes:
            progress.say(f"measuring {mode}: {script.name} runs for real on JAX's {device.device_kind} "
                         f"({device.platform}) in a fresh process")
            run = measure_mode(script, list(args.script_args), mode, chip=slice_.chip,
                               world=slice_.total_chips, chips_per_host=slice_.chip.chips_per_host,
                               timeout_s=args.pjrt_timeout or None)
            runs.append(run)
            step = step_stats(run.steps_s, run.total_s).median_s
            progress.say(f"measured {mode}: {len(run.steps_s)} steps, median step "
                         f"{format_seconds(step) if step is not None else '-'}"
                         + (f"; it failed with {run.error_type}" if run.error_type else ""))
            if run.exit_code == INTERRUPTED:
                break
        return Measured(device, slice_.chip.name, chip_from, tuple(runs))

    return measure


def _import_backend():
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
    """Ctrl-C once the script has ended: pressed while ``stoppable`` work runs (pricing, placements, measuring)
    it stops that work and the report covers what was done; pressed at any other time (writing the report)
    it prints one line and no stoppable work starts after it; so any number of presses never loses the
    report. Python's own handler is back on exit. (While the script runs, Ctrl-C is the script's:
    tpusim/script.py.)"""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.stopped = False                # Ctrl-C stopped some work
        self._stoppable = False
        self._told = False
        self._previous = None

    def __enter__(self) -> Interrupts:
        # not outside the main thread (Python delivers signals there only), nor where Ctrl-C is ignored on
        # purpose (started with SIGINT ignored: nohup, a background job of a script)
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN):
            self._previous = signal.signal(signal.SIGINT, self._pressed)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)

    def _pressed(self, signum: int, frame: object) -> None:
        if self._stoppable:
            self._stoppable = False
            self.stopped = True
            raise KeyboardInterrupt
        self.stopped = True                 # no stoppable work starts after this press
        if not self._told:
            self._told = True
            print("\ntpusim: Ctrl-C: writing the report of what was done first (Ctrl-C again changes nothing)",
                  file=sys.stderr, flush=True)

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


def _price_and_report(trace, slice_, modes, script, args, outcome, torch_version, out_dir, progress,
                      interrupts: Interrupts, measure: Callable[[], Measured] | None = None,
                      recording_stopped=None) -> tuple[Measured | None, bool]:
    """Price every mode, build the report from its typed parts (plus what ``measure`` finds for real), write
    it, print the summary; returns what was measured and whether Ctrl-C stopped pricing."""
    from tpusim.placement import compare, distributed_info
    from tpusim.pricing import price
    from tpusim.report import Interrupted, RunInfo, build_report, summary_table, write_report
    from tpusim.report.faults import slowdown_lines, slowdown_section
    from tpusim.report.lint import lint
    from tpusim.report.placements import format_placements
    from tpusim.trace.records import write_trace

    timelines = {}

    def price_modes() -> None:
        progress.steps("pricing", len(modes), unit="modes")
        try:
            for mode in modes:
                began = time.perf_counter()
                timelines[mode] = price(trace, topology=slice_, mode=mode)
                progress.say(f"priced {mode}: {timelines[mode].total_s:.6g} s simulated in "
                             f"{time.perf_counter() - began:.1f} s")
                progress.advance()
        finally:
            progress.stop()

    priced = interrupts.stoppable(price_modes)
    if not priced:
        progress.say(f"Ctrl-C: pricing stopped; reporting {', '.join(timelines) or 'no mode'}")
    fastest = min(timelines, key=lambda mode: timelines[mode].total_s) if timelines else None
    placements = measured = None
    if args.compare_placements and fastest is not None:
        def price_placements() -> None:
            nonlocal placements
            placements = compare(trace, slice_, lambda t, s: price(t, topology=s, mode=fastest))
        priced = interrupts.stoppable(price_placements) and priced
    if measure is not None and priced:
        def run_measured() -> None:
            nonlocal measured
            measured = measure()
        interrupts.stoppable(run_measured)
    script_stopped = outcome.error_type == "KeyboardInterrupt"
    interrupted = (Interrupted(script=script_stopped, pricing=not priced,
                               not_priced=tuple(m for m in modes if m not in timelines))
                   if script_stopped or not priced else None)
    info = RunInfo(script=str(args.script), argv=tuple(args.script_args), topology=slice_.spec,
                   numerics=args.numerics, target=args.target, torch_version=torch_version,
                   error_type=outcome.error_type, error_traceback=outcome.error, exit_code=outcome.exit_code,
                   interrupted=interrupted, tokens_per_step=getattr(args, "tokens_per_step", None),
                   recording_stopped=recording_stopped)
    warnings = lint(trace, slice_.chip, timelines[fastest] if fastest else None)
    distributed = distributed_info(trace, slice_)
    faults = None
    if slice_.faults and timelines:          # the slowdown against the healthy slice, per mode priced
        healthy = {mode: price(trace, topology=slice_.healthy, mode=mode) for mode in timelines}
        faults = slowdown_section(slice_, timelines, healthy)
    report = build_report(info, trace, slice_, timelines, warnings, distributed=distributed, placements=placements,
                          measured=measured, faults=faults)
    try:
        write_trace(trace, out_dir / "program.jsonl")
        write_report(out_dir, report, timelines)
    except OSError as error:                 # a full disk, the folder removed while the script ran, ...
        raise TpusimError(f"cannot write the report to {str(out_dir)!r}: {error.strerror or error}"
                          f"{f' ({error.filename})' if error.filename else ''}") from None
    print(summary_table(report, str(out_dir)))
    for line in slowdown_lines(faults):
        print(line)
    print(format_placements(distributed, placements), end="")
    return measured, not priced
