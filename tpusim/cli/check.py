"""``tpusim check SCRIPT``: a readiness gate for CI. Runs the script as ``tpusim run`` does (the same code:
tpusim/run/pipeline.py), then checks the report against budgets and lint codes.

Exit codes (documented in docs/commands/check.md): 0 every check passed; 1 a budget or lint rule failed;
2 bad input (a flag, a topology, a missing script); 3 the script itself failed. The summary is a few lines
(or JSON with ``--json``), and ``--junit FILE`` writes JUnit XML for CI test-result views.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpusim.errors import TpusimError
from tpusim.testing.budgets import Budgets, Check, evaluate, parse_hbm, parse_lint_list, parse_seconds, script_check

if TYPE_CHECKING:
    from tpusim.report.schema import Report
    from tpusim.run.options import RunOptions

OK, FAILED, BAD_INPUT, SCRIPT_FAILED = 0, 1, 2, 3

DESCRIPTION = """\
tpusim check SCRIPT: a TPU-readiness gate for CI. Runs the script exactly as `tpusim run` does, then checks
the report against budgets (step time, HBM peak) and lint codes (float64, host syncs in the step loop, ...).

Exit codes: 0 every check passed; 1 a budget or lint rule failed; 2 bad input (a flag, a topology, a missing
script); 3 the script itself failed. The summary is a few lines (or JSON with --json), and --junit FILE writes
JUnit XML for CI test-result views."""

EXAMPLES = """\
exit codes: 0 ok, 1 a budget or lint rule failed, 2 bad input, 3 the script failed

examples:
  python -m tpusim check examples/mlp.py --max-step-time 5ms --fail-on f64,host-sync
  python -m tpusim check train.py --topology 3d:4x4x4 --chip v5p --max-hbm 0.9 --junit tpusim.xml
  python -m tpusim check train.py --mode strict,fused --max-step-time 20ms --json -- --batch 64
"""


def add_parser(subparsers) -> None:
    from tpusim.eager.modes import DEFAULT_MODE
    from tpusim.run.options import add_fit_batch_argument, add_slices_argument

    parser = subparsers.add_parser(
        "check", help="CI gate: run a script and fail on step-time / HBM budgets or lint findings",
        description=DESCRIPTION, epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("script", metavar="SCRIPT", help="the Python file to run, e.g. train.py")
    parser.add_argument("--topology", metavar="SPEC", help="slice shape, e.g. 3d:4x4x4 (default: one chip)")
    parser.add_argument("--chip", help="chip generation, e.g. v5p, v6e")
    add_slices_argument(parser)
    parser.add_argument("--mode", default=DEFAULT_MODE, help=f"eager mode(s) (default {DEFAULT_MODE}); "
                                                              f"budgets apply to every mode given")
    parser.add_argument("--numerics", choices=("on", "off", "tpu"), default="on",
                        help="off: shape-only run; tpu: a TPU's values (as tpusim run --numerics)")
    parser.add_argument("--placement", metavar="MAP", help="DeviceMesh dims -> torus axes, e.g. 'tp=x,fsdp=yz'")
    parser.add_argument("--max-step-time", metavar="T", type=_flag(parse_seconds),
                        help="fail when the median steady-state step is slower than T (12ms, 0.5s)")
    parser.add_argument("--max-hbm", metavar="F", type=_flag(parse_hbm),
                        help="fail when the HBM peak is above F: a share of the chip's HBM (0.9, 90%%) or a size "
                             "(12GiB)")
    parser.add_argument("--fail-on", metavar="LINT,...", type=_flag(parse_lint_list), default=(),
                        help="fail on these lint codes (float64 alias f64, host-sync, mxu-padding, hbm, recompile, "
                             "comm-bound, graph-break, ...; or all)")
    from tpusim.hardware.calibration import add_calibration_argument
    from tpusim.xla.programs import COMPILERS

    add_calibration_argument(parser)
    parser.add_argument("--compiler", choices=COMPILERS, default="auto",
                        help="who prices the programs: xla (the real TPU compiler, deviceless), model or auto "
                             "(default), as in tpusim run")
    add_fit_batch_argument(parser)
    parser.add_argument("--junit", metavar="FILE", help="also write the checks as JUnit XML to FILE")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON on stdout (the script's "
                                                            "own output then goes to stderr)")
    parser.add_argument("--out", metavar="DIR", help="the full report's folder (default "
                                                     "reports/check-<script>-<time>)")
    parser.set_defaults(run=run, script_args=[])


def _flag(parse):
    """A budget parser as an argparse type: its TpusimError becomes argparse's one-line usage error (exit 2)."""
    def convert(text: str):
        try:
            return parse(text)
        except TpusimError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
    convert.__name__ = parse.__name__
    return convert


def default_out_dir(script: str) -> Path:
    """reports/check-<script>-<time>-<pid>: a CI job can upload it as an artifact; two checks never share one."""
    return Path("reports") / f"check-{Path(script).stem}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


def run_options(args: argparse.Namespace, out_dir: Path) -> RunOptions:
    """The run this check gates: `tpusim run`'s defaults but for the flags check shares with it."""
    from tpusim.run.options import RunOptions, modes_of

    return RunOptions(script=args.script, script_args=tuple(args.script_args), chip=args.chip, topology=args.topology,
                      slices=args.slices, modes=modes_of(args.mode), numerics=args.numerics, placement=args.placement,
                      out=str(out_dir), quiet=True, compiler=args.compiler, calibration=not args.no_calibration,
                      table=False, fit_batch=args.fit_batch)


def run(args: argparse.Namespace) -> int:
    from tpusim.run.pipeline import run_pipeline
    from tpusim.script import wait_for_script_threads

    if args.junit is not None and not Path(args.junit).parent.is_dir():
        folder = Path(args.junit).parent
        why = "is not a folder" if folder.exists() else "does not exist"     # a file there: not "missing" (H06)
        raise TpusimError(f"--junit {args.junit!r}: its folder {str(folder)!r} {why}")
    budgets = Budgets(args.max_step_time, args.max_hbm, tuple(args.fail_on))
    out_dir = Path(args.out) if args.out else default_out_dir(args.script)
    started = time.perf_counter()
    before = set(threading.enumerate())     # the script's threads that never end: said, then waited for
    # with --json stdout carries only the summary: the script's prints and run's table go to stderr
    with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
        result = run_pipeline(run_options(args, out_dir))
    report, code = result.report, result.exit_code
    if report is None:                      # run stopped before writing a report (Ctrl-C)
        return code or BAD_INPUT
    script = script_check(report)
    checks = [script] + (evaluate(report, budgets) if script.passed else [])
    status = (SCRIPT_FAILED if not script.passed else
              OK if all(c.passed for c in checks) and code == 0 else
              code if code in (BAD_INPUT, 129, 130, 143) else FAILED)   # a signal: the shell's status
    if args.junit:
        from tpusim.output import write_atomic
        from tpusim.testing.junit import junit_xml

        write_atomic(args.junit, junit_xml(f"tpusim check {report.run.script}", checks,
                                           time.perf_counter() - started))
    summary = summarise(report, checks, status, str(out_dir))
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print(summary_text(summary))
    return wait_for_script_threads(before, status)


def summarise(report: Report, checks: list[Check], status: int, out: str) -> dict[str, Any]:
    """The machine-readable summary (``--json``): the verdict, each check, each mode's headline numbers."""
    words = {OK: "ok", FAILED: "failed", BAD_INPUT: "bad input", SCRIPT_FAILED: "script failed"}
    return {
        "status": words.get(status, "interrupted"), "exit_code": status,
        "script": report.run.script, "topology": report.run.topology, "chip": report.run.chip,
        "modes": {mode: {"step_time_s": entry.step_time_median_s, "hbm_peak_bytes": entry.hbm.peak_bytes,
                         "hbm_peak_fraction": entry.hbm.peak_fraction, "hfu": entry.hfu,
                         "mfu": entry.headline.model_flops_utilisation if entry.headline else None,
                         **({"largest_batch": entry.largest_batch.model_dump()} if entry.largest_batch else {})}
                  for mode, entry in report.modes.items()},
        "checks": [{"name": c.name, "passed": c.passed, "message": c.message} for c in checks],
        "lint": sorted({w.code for w in report.warnings}),
        "report": out,
    }


def summary_text(summary: dict[str, Any]) -> str:
    lines = [f"{'PASS' if c['passed'] else 'FAIL'} {c['name']}: {c['message']}" for c in summary["checks"]]
    failed = sum(not c["passed"] for c in summary["checks"])
    lines.append(f"tpusim check: {summary['status']} ({failed} of {len(summary['checks'])} checks failed; "
                 f"exit code {summary['exit_code']})")
    return "\n".join(lines)
