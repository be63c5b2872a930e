"""``tpusim compare A [B]``: two runs side by side, or one run re-priced on another slice or chip.

A and B are report folders written by ``tpusim run`` (or their report.json). With only A and
``--topology``/``--chip``/``--mode``, A's recorded program (program.jsonl) is re-priced by
replay, without running the script again.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpusim.errors import TpusimError, printable
from tpusim.report.text import HFU_LABEL, MFU_LABEL, percent_text, resolved, seconds_text
from tpusim.units import format_bytes

if TYPE_CHECKING:
    from tpusim.report.schema import Report

EXAMPLES = """\
examples:
  python -m tpusim compare reports/run-a reports/run-b             # two runs, ratio B / A
  python -m tpusim compare reports/run-a --topology 3d:4x4x8        # same program on another slice
  python -m tpusim compare reports/run-a --chip v6e --topology 2d:16x16 --mode all
"""

METRICS = (
    ("step time (median)", lambda m: m.step_time_median_s, seconds_text),
    ("whole program", lambda m: m.total_s, seconds_text),
    ("kernels", lambda m: m.kernels, str),
    ("host stall", lambda m: m.host_s.stall, seconds_text),
    ("collectives exposed", lambda m: m.device_s["collective_exposed"], seconds_text),
    (HFU_LABEL, lambda m: m.hfu, percent_text),
    (MFU_LABEL, lambda m: m.headline.model_flops_utilisation if m.headline else None, percent_text),
    ("HBM peak", lambda m: m.hbm.peak_bytes, format_bytes),
)


def add_parser(subparsers) -> None:
    from tpusim.hardware.calibration import add_calibration_argument
    from tpusim.slice.faults import add_fault_arguments
    from tpusim.slice.topology import slices_flag
    from tpusim.xla.programs import COMPILERS

    parser = subparsers.add_parser(
        "compare", help="compare two reports, or re-price one report's program on another slice/chip/mode",
        description=__doc__.replace("``", ""), epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", metavar="A", help="report folder (or its report.json)")
    parser.add_argument("b", metavar="B", nargs="?", help="second report folder; omit to re-price A")
    parser.add_argument("--topology", metavar="SPEC", help="re-price A on this slice, e.g. 3d:4x4x8")
    parser.add_argument("--chip", help="re-price A on this chip generation, e.g. v6e")
    parser.add_argument("--slices", type=slices_flag, metavar="N",
                        help="re-price A on N copies of its slice (or --topology's) joined over DCN (multislice)")
    parser.add_argument("--mode", help="re-price A in these eager modes (e.g. fused, all)")
    parser.add_argument("--compiler", choices=COMPILERS, default="auto",
                        help="re-pricing A: xla builds the programs A's recording kept with the real TPU compiler "
                             "for the new chip, model with tpusim's own, auto: as tpusim run chooses")
    add_fault_arguments(parser)   # re-price A on its slice (or --topology's) with links or chips removed
    add_calibration_argument(parser)
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON")
    parser.set_defaults(run=run)


def load_report(path: str) -> tuple[Report, Path]:
    """A report folder (or its report.json), its schema and version checked (tpusim/report/load.py)."""
    from tpusim.report.load import load_report as load

    return load(path)


def reprice(folder: Path, report: Report, topology: str | None, chip: str | None,
            modes: str | None, faults: tuple = (None, None, None), compiler: str = "auto",
            calibration: bool = True, slices: int | None = None) -> Report:
    """A's program trace priced again: a new report in memory, labelled by what changed; the programs the
    recording kept (compiled graphs, and eager ops when A ran with the compiler) go through the TPU compiler
    for the new chip as ``compiler`` says (tpusim/xla/)."""
    from tpusim.eager.modes import DEFAULT_MODE, get_mode, resolve_modes
    from tpusim.pricing import price
    from tpusim.pricing.compiled import ask_compiler, compiler_output
    from tpusim.report import RunInfo, build_report
    from tpusim.report.lint import lint
    from tpusim.slice.faults import apply_faults
    from tpusim.slice.topology import build_slice
    from tpusim.trace.records import read_trace

    program = folder / "program.jsonl"
    if not program.is_file():
        raise TpusimError(f"{folder}: no program.jsonl to re-price (it is written by `tpusim run`)")
    trace = read_trace(program)
    slice_ = build_slice(topology or report.run.topology, chip=chip or (None if topology else report.run.chip),
                         slices=slices or report.slice.slices or 1, calibrated=calibration)
    slice_ = apply_faults(slice_, *faults)
    names = resolve_modes(modes) if modes else list(report.modes) or [DEFAULT_MODE]
    xla = ask_compiler(trace, slice_.chip, compiler)       # as `tpusim run` asks it (tpusim.pricing.compiled)
    compiled = compiler_output(xla)
    timelines = {mode: price(trace, topology=slice_, mode=get_mode(mode), compiled=compiled) for mode in names}
    run = report.run
    info = RunInfo(script=run.script, argv=tuple(run.argv), topology=slice_.spec, numerics=run.numerics,
                   torch_version=run.torch_version, tokens_per_step=run.tokens_per_step)
    on_slice = dataclasses.replace(trace, world_size=slice_.total_chips)      # the lint's idle-chips rule reads it
    return build_report(info, trace, slice_, timelines, lint(on_slice, slice_.chip, timelines[names[-1]]), xla=xla)


def label(report: Report) -> str:
    from tpusim.report.text import slice_text

    return f"{slice_text(report.run.topology, report.slice.slices)} {report.run.chip}"


def notes(a: Report, b: Report) -> list[str]:
    """What to know before reading the ratios: different programs, incomplete runs."""
    from tpusim.report.load import STEADY_MEDIAN_SINCE, median_meaning
    from tpusim.report.model import incomplete_reason

    found = []
    script_a, script_b = a.run.script, b.run.script
    argv_a, argv_b = a.run.argv, b.run.argv
    if script_a != script_b:
        found.append(f"A and B ran different scripts (A: {script_a}, B: {script_b}): the ratios compare two "
                     f"programs, not one program on two slices")
    elif argv_a != argv_b:
        found.append(f"A and B ran {script_a} with different arguments (A: {' '.join(argv_a) or 'none'}, "
                     f"B: {' '.join(argv_b) or 'none'})")
    if (a.run.chip, a.slice.dims, a.slice.slices or 1) != (b.run.chip, b.slice.dims, b.slice.slices or 1):
        found.append(f"A and B priced different slices (A: {label(a)}, B: {label(b)}): the ratios include the "
                     f"change of chip, torus shape and slice count, not only the program")
    if (a.version >= STEADY_MEDIAN_SINCE) != (b.version >= STEADY_MEDIAN_SINCE):
        found.append(f"A is a version {a.version} report and B a version {b.version} one: A's step time "
                     f"median (and HFU) is over {median_meaning(a)}, B's over {median_meaning(b)}; run the "
                     f"older one again for a like-for-like comparison")
    for name, report in (("A", a), ("B", b)):
        if report.slice.shape_note:
            found.append(f"{name}: {report.slice.shape_note}")
    for name, report in (("A", a), ("B", b)):
        reason = incomplete_reason(report)
        if reason:
            found.append(f"{name} is incomplete ({reason}): its numbers cover only what ran")
    return found


def comparison(a: Report, b: Report) -> list[dict[str, Any]]:
    """Rows (mode, metric, A, B, B/A) for every mode both reports priced (or A's vs B's only mode)."""
    pairs = [(m, m) for m in a.modes if m in b.modes]
    if not pairs:
        pairs = [(ma, mb) for ma in a.modes for mb in b.modes]
    rows = []
    for mode_a, mode_b in pairs:
        for name, get, fmt in METRICS:
            va, vb = get(a.modes[mode_a]), get(b.modes[mode_b])
            if va is None and vb is None and name == MFU_LABEL:      # neither run knew its tokens per step
                continue
            rows.append({"mode": mode_a if mode_a == mode_b else f"{mode_a} vs {mode_b}", "metric": name,
                         "a": va, "b": vb, "ratio": _ratio(va, vb), "a_text": fmt(va), "b_text": fmt(vb)})
    return rows


def _ratio(a: float | None, b: float | None) -> float | None:
    """b / a, or None when either is missing or below the simulator's resolution (0.0% vs 0.0% is no 41.6x)."""
    if a is None or b is None or resolved(a) == 0.0 or resolved(b) == 0.0:
        return None
    return b / a


def run(args: argparse.Namespace) -> int:
    from tpusim.slice.faults import fault_args

    a, folder = load_report(args.a)
    faults = fault_args(args)
    if args.b:
        if args.topology or args.chip or args.mode or args.slices or any(faults):
            raise TpusimError("give either a second report B or --topology/--chip/--slices/--mode to re-price A, "
                              "not both")
        b, _ = load_report(args.b)
    elif args.topology or args.chip or args.mode or args.slices or any(faults):
        # like for like: B is priced calibrated when A was
        b = reprice(folder, a, args.topology, args.chip, args.mode, faults, args.compiler,
                    calibration=a.chip.calibrated and not args.no_calibration, slices=args.slices)
    else:
        raise TpusimError("nothing to compare: give a second report B, or --topology/--chip/--slices/--mode to "
                          "re-price A")
    if not a.modes or not b.modes:
        raise TpusimError(f"nothing to compare: {'A' if not a.modes else 'B'} priced no eager mode "
                          f"(its run was interrupted before pricing); re-price it with --mode")
    rows = comparison(a, b)
    found = notes(a, b)
    if args.json:
        print(json.dumps({"a": label(a), "b": label(b), "notes": found,
                          "rows": [{k: r[k] for k in ("mode", "metric", "a", "b", "ratio")} for r in rows]},
                         indent=1))
        return 0
    for note in found:
        print(printable(f"note: {note}"))          # a report's script name may hold terminal escapes
    head_a, head_b = printable(f"A: {label(a)}"), printable(f"B: {label(b)}")
    width_a = max(len(head_a), *(len(r["a_text"]) for r in rows))
    width_b = max(len(head_b), *(len(r["b_text"]) for r in rows))
    print(f"{'mode':8} {'metric':20} {head_a:>{width_a}} {head_b:>{width_b}}    B/A")
    for r in rows:
        ratio = f"{r['ratio']:.3g}x" if r["ratio"] is not None else "-"
        print(f"{r['mode']:8} {r['metric']:20} {r['a_text']:>{width_a}} {r['b_text']:>{width_b}} {ratio:>7}")
    return 0
