"""``tpusim run SCRIPT``: run a PyTorch script on the simulated slice and write its cost report.

The one command that reaches both layers: it imports the PyTorch backend lazily (only
here), records the script's program trace once, and prices it per eager mode.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tpusim.errors import TpusimError

EXAMPLES = """\
The script runs unchanged as __main__ with its own arguments (after --); its tensors on
device "tpu" live on the simulated chip. Steps are counted at optimizer.step() or at an
explicit tpusim.backend.step().

examples:
  python -m tpusim run examples/mlp.py                          # one v5p chip, strict mode
  python -m tpusim run examples/transformer.py --topology 3d:8x8x8 --mode all
  python -m tpusim run examples/transformer.py --numerics off -- --layers 24 --d-model 2048
  python -m tpusim run examples/dlrm.py --chip v5e --topology 2d:4x4 --out reports/dlrm-v5e

What it writes (in --out, default reports/<script>-<topology>-<time>/):
  report.json   the versioned cost report (the contract; see tpusim/report/model.py)
  report.html   one self-contained page with the figures; *.png the figures alone
  trace.json    Chrome/Perfetto trace of the fastest mode (open in ui.perfetto.dev)
  program.jsonl the recorded program trace, to re-price without re-running
"""


def add_parser(subparsers) -> None:
    from tpusim.pricing import DEFAULT_MODE, MODES

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
    parser.set_defaults(run=run, script_args=[])


class Progress:
    """One status line on stderr while the script runs and while pricing; silent with --quiet."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.tty = sys.stderr.isatty()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def say(self, text: str) -> None:
        if not self.quiet:
            prefix, suffix = ("\r", "\033[K\n") if self.tty else ("", "\n")
            print(f"{prefix}tpusim: {text}", file=sys.stderr, end=suffix, flush=True)

    def watch(self, status: Callable[[], str], every_s: float) -> None:
        """Print ``status()`` every ``every_s`` seconds (in place on a terminal) until ``stop``."""
        if self.quiet:
            return

        def loop() -> None:
            while not self._stop.wait(every_s):
                text = f"tpusim: {status()}"
                if self.tty:
                    print(f"\r{text}\033[K", end="", file=sys.stderr, flush=True)
                else:
                    print(text, file=sys.stderr, flush=True)

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            if self.tty:
                print("\r\033[K", end="", file=sys.stderr, flush=True)


def default_out_dir(script: Path, topology: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("reports") / f"{script.stem}-{topology.replace(':', '_')}-{stamp}"


def run(args: argparse.Namespace) -> int:
    from tpusim.pricing import resolve_modes, single_chip_topology
    from tpusim.script import check_script, run_script
    from tpusim.spec import load_chip
    from tpusim.topology import build_slice

    script = check_script(args.script)
    modes = resolve_modes(args.mode)
    if args.topology is None:
        topology = single_chip_topology(load_chip(args.chip or "v5p"))
        chip = args.chip or "v5p"
    else:
        topology, chip = args.topology, args.chip
    slice_ = build_slice(topology, chip=chip)  # bad topology/chip fails here, before the script runs
    out_dir = Path(args.out) if args.out else default_out_dir(script, slice_.spec)
    if out_dir.exists() and not out_dir.is_dir():
        raise TpusimError(f"--out {out_dir} exists and is not a folder")
    progress = Progress(args.quiet)

    os.environ["TPUSIM_CHIP"] = slice_.chip.name
    os.environ["TPUSIM_NUMERICS"] = args.numerics
    if len(modes) == 1:                      # the script runs in the one mode priced (tpusim/eager.py)
        os.environ["TPUSIM_EAGER_MODE"] = modes[0]
    progress.say(f"running {script.name} on {slice_.spec} ({slice_.chip.display_name}, "
                 f"{slice_.total_chips} chips), numerics {args.numerics}")
    backend = _import_backend()
    import torch

    from tpusim.backend.distributed import runner
    ranks = runner.resolve_ranks(args.ranks, slice_.total_chips, script)
    started = time.perf_counter()
    if ranks == "all":
        progress.say(f"--ranks all: {slice_.total_chips} processes, one per chip")
        trace, outcome = runner.record_all(script, list(args.script_args), slice_.total_chips,
                                           slice_.chip.chips_per_host, out_dir)
    else:
        runner.prepare_one(slice_.total_chips, slice_.chip.chips_per_host)
        with backend.recording() as recorder:
            progress.watch(lambda: f"running {script.name}: {len(recorder.records)} records, "
                                   f"{time.perf_counter() - started:.0f} s", every_s=0.5 if progress.tty else 5.0)
            try:
                outcome = run_script(script, list(args.script_args))
            finally:
                progress.stop()
        trace = runner.ranks_one_meta(dataclasses.replace(recorder.trace, world_size=slice_.total_chips))
    from tpusim.placement import apply_placement
    trace = apply_placement(trace, slice_, args.placement)
    if outcome.error:
        print(outcome.error, file=sys.stderr, end="")
    progress.say(f"recorded {len(trace.records)} records in {time.perf_counter() - started:.1f} s; "
                 f"pricing {', '.join(modes)}")
    report_path = _price_and_report(trace, slice_, modes, script, args, outcome, torch.__version__, out_dir,
                                    progress)
    return outcome.exit_code if outcome.exit_code else (0 if report_path else 1)


def _import_backend():
    try:
        import torch  # noqa: F401  (first: torch's autoload entry point then registers the device)

        import tpusim.backend as backend
    except ImportError as error:
        raise TpusimError(f"the tpu device could not be loaded: {error}") from None
    return backend


def _price_and_report(trace, slice_, modes, script, args, outcome, torch_version, out_dir, progress) -> Path:
    from tpusim.lint import lint
    from tpusim.pricing import price
    from tpusim.report import RunInfo, build_report, summary_table, write_report
    from tpusim.trace import write_trace

    timelines = {}
    for mode in modes:
        began = time.perf_counter()
        timelines[mode] = price(trace, topology=slice_, mode=mode)
        progress.say(f"priced {mode}: {timelines[mode].total_s:.6g} s simulated in "
                     f"{time.perf_counter() - began:.1f} s")
    info = RunInfo(script=str(args.script), argv=tuple(args.script_args), topology=slice_.spec,
                   numerics=args.numerics, torch_version=torch_version, error_type=outcome.error_type,
                   error_traceback=outcome.error)
    fastest = min(timelines.values(), key=lambda t: t.total_s)
    report = build_report(info, trace, slice_, timelines, lint(trace, slice_.chip, fastest))
    from tpusim.placement import format_placements, report_sections
    fastest_mode = next(m for m, t in timelines.items() if t is fastest)
    report.update(report_sections(trace, slice_, args.compare_placements,
                                  lambda t, s: price(t, topology=s, mode=fastest_mode)))
    out_dir.mkdir(parents=True, exist_ok=True)
    write_trace(trace, out_dir / "program.jsonl")
    write_report(out_dir, report, timelines)
    print(summary_table(report, str(out_dir)))
    print(format_placements(report), end="")
    return out_dir
