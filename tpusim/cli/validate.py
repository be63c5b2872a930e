"""``tpusim validate``: predicted vs published TPU measurements, with each chip's calibration."""

from __future__ import annotations

import argparse
import json
import sys
import time

from tpusim.errors import TpusimError

EXAMPLES = """\
Each case reproduces one published TPU measurement: its source, chip, slice, parallelism and batch
are in `--list` and `--json`. Training steps go through the product path (path "product"): the run
written as a PyTorch script (validation/decoder.py) is recorded by `tpusim run` and priced as `tpusim
run` prices it; so does serving (validation/decode.py: a static-KV-cache decode loop, its median time per
output token against a published TPOT). MaxText's and MLPerf's runs are also priced from hand-built step traces (path
"closed-form"), kept as a cross-check; the scaling book's collectives and matmul are priced alone.
The error is (predicted - published) / published. "held out" cases were not used to fit any
calibrated parameter of their chip (topologies/calibration/), nor was their twin on the other path;
"analytic" rows are the source's own pen-and-paper estimates, reported apart.

examples:
  python -m tpusim validate                      # every case (about half an hour), table and summary
  python -m tpusim validate --fast               # the quick cases only (under a minute)
  python -m tpusim validate --case sb-c2-allgather-v5e-4x8-profile --json out.json
  python -m tpusim validate --explain product-maxtext-v5p-32b-v5p-128
  python -m tpusim validate --case decode-vllm-llama3.3-70b-v6e-8-c64   # one serving case (minutes)
  python -m tpusim validate --leave-one-family-out   # each model family priced with a calibration fitted
                                                     # without it (product-path cases)
  python -m tpusim validate --no-calibration     # the datasheet chips, before calibration
  python -m tpusim validate --fit mxu_efficiency --on maxtext-v5e-16b-1xv5e-256,maxtext-v5e-32b-1xv5e-256
"""


def add_parser(subparsers) -> None:
    from tpusim.hardware.calibration import add_calibration_argument

    parser = subparsers.add_parser(
        "validate", help="compare predictions with published TPU measurements (the fidelity suite)",
        description="Price each fidelity case (a published TPU measurement) and print published, predicted "
                    "and error, with the mean and max error over the held-out cases.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", action="append", metavar="NAME", help="run only this case (repeatable)")
    parser.add_argument("--fast", action="store_true", help="skip the cases marked slow")
    parser.add_argument("--list", action="store_true", help="list the cases with their sources and exit")
    parser.add_argument("--json", metavar="PATH", help="also write the results (and summary) as JSON")
    add_calibration_argument(parser)
    parser.add_argument("--explain", metavar="CASE",
                        help="where CASE's predicted time goes and how much each calibrated parameter moves it")
    parser.add_argument("--fit", metavar="PARAM", help="fit one share parameter (e.g. mxu_efficiency) on --on")
    parser.add_argument("--on", metavar="CASES", help="comma-separated cases for --fit (one chip generation)")
    parser.add_argument("--leave-one-family-out", action="store_true",
                        help="price each model family's product-path cases with mxu_efficiency refitted without "
                             "them (siblings of a fit case never check themselves)")
    parser.add_argument("--compiler", choices=("model", "xla", "both"), default="model",
                        help="who builds the compiled programs a training case prices: tpusim's model (default), "
                             "the TPU compiler (xla: the path `tpusim run --compiler auto` takes where the xla extra "
                             "is installed; recorded with its op programs, slow), or both side by side (NAME@xla)")
    parser.add_argument("--write-bands", action="store_true",
                        help="write the held-out error band of each mode all of whose cases ran to "
                             "topologies/fidelity/error_bands.toml, which every report prints beside the mode")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tpusim.validate import CASES, find_case, run_cases, summarise
    from tpusim.validate.bands import complete_modes, mode_bands, write_bands

    if args.list:
        print(format_list(CASES))
        return 0
    calibration = not args.no_calibration
    if args.fit:
        return _fit(args, CASES)
    if args.on:
        raise TpusimError("--on goes with --fit")
    if args.explain:
        return _explain(args, find_case(CASES, args.explain), calibration)
    if args.leave_one_family_out:
        return _leave_one_family_out(args, CASES)
    if args.write_bands and (args.no_calibration or args.compiler != "model"):
        raise TpusimError("--write-bands writes what the report prints: the calibrated chips on the model path "
                          "(drop --no-calibration and --compiler)")
    cases = [find_case(CASES, name) for name in args.case] if args.case else list(CASES)
    suite = list(CASES)                      # every case of each band, for --write-bands
    if args.compiler != "model":
        from tpusim.pricing.compiled import check_compiler
        from tpusim.validate.product import with_compiler

        check_compiler("xla")                # the extra missing: one line before anything records
        cases = with_compiler(cases, args.compiler)
        suite = with_compiler(suite, args.compiler)
    if args.fast:
        cases = [c for c in cases if not c.slow]
    started = time.monotonic()

    def progress(case) -> None:
        if not args.quiet:
            print(f"pricing {case.name}{' (slow)' if case.slow else ''} ...", file=sys.stderr, flush=True)

    results = run_cases(cases, calibration, progress)
    summary = summarise(results)
    print(format_table(results, summary, calibration))
    if not args.quiet:
        print(f"({len(results)} cases in {time.monotonic() - started:.1f} s)", file=sys.stderr)
    bands = mode_bands(results)
    if args.json:
        _write_json(args.json, {"calibrated": calibration, "results": [r.to_dict() for r in results],
                                "summary": {k: s.to_dict() for k, s in summary.items()}, "modes": bands})
    if args.write_bands:
        modes = complete_modes(results, suite)
        if not modes:
            raise TpusimError("--write-bands: no mode had every one of its cases priced here (run them all, or every "
                              "case of one mode with --case)")
        print(f"wrote the error band of {', '.join(sorted(modes))} to {write_bands(results, modes)}")
    return 0


# ---------------------------------------------------------------------------- formatting

def _fmt_s(seconds: float) -> str:
    from tpusim.units import format_seconds

    return format_seconds(seconds)


def format_table(results, summary, calibration: bool) -> str:
    rows = [("case", "path", "chip", "published", "predicted", "error", "held out")]
    for r in results:
        held = "yes" if r.held_out else "fitted"
        path = r.case.path if r.case.kind == "measured" else "analytic"
        rows.append((r.case.name, path, r.case.chip, _fmt_s(r.case.published_s), _fmt_s(r.predicted_s),
                     f"{r.error:+.1%}", held if r.case.kind == "measured" else "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    right = {3, 4, 5}
    lines = [("calibrated: topologies/calibration/<chip>.toml" if calibration
              else "uncalibrated: datasheet chips (topologies/chips), no calibration")]
    for row in rows:
        lines.append("  ".join(cell.rjust(w) if i in right else cell.ljust(w)
                               for i, (cell, w) in enumerate(zip(row, widths))).rstrip())
    lines.append("")
    labels = {"product_held_out": "product path, held out", "product_fitted": "product path, fit cases",
              "closed_form": "closed-form cross-check", "held_out": "all measured, held out",
              "analytic": "analytic formula checks"}
    for key, label in labels.items():
        s = summary[key]
        if not s.count:
            lines.append(f"{label:26s} (0 cases)")
            continue
        lines.append(f"{label:26s} ({s.count:2d} cases): mean |error| {s.mean_abs:6.1%}, max {s.max_abs:6.1%} "
                     f"({s.worst})")
    from tpusim.validate.bands import mode_bands
    from tpusim.validate.suite import Summary, summary_of

    held = [r for r in results if r.held_out and r.case.kind == "measured"]
    extra = [summary_of(f"held out, compiler {compiler}", [r for r in held if r.case.compiler == compiler])
             for compiler in sorted({r.case.compiler for r in results if r.case.compiler} - {"model"})]
    extra += [Summary(f"held out, mode {mode}", band["cases"], band["mean_abs_error"], band["max_abs_error"],
                      band["worst"]) for mode, band in mode_bands(results).items()]   # the band reports print
    for s in extra:
        if s.count:
            lines.append(f"{s.label:26s} ({s.count:2d} cases): mean |error| {s.mean_abs:6.1%}, max {s.max_abs:6.1%} "
                         f"({s.worst})")
    return "\n".join(lines)


def format_list(cases) -> str:
    lines = []
    for c in cases:
        lines.append(f"{c.name}{'  [slow]' if c.slow else ''}  ({c.kind})")
        lines.append(f"  {c.title}")
        lines.append(f"  chip {c.chip}; slice {c.slice}")
        lines.append(f"  setup: {c.setup}")
        lines.append(f"  published: {c.published}" + (f"; {c.conversion}" if c.conversion else ""))
        lines.append(f"  source: {c.source} ({c.where})")
    return "\n".join(lines)


def _explain(args, case, calibration: bool) -> int:
    from tpusim.validate import explain

    ex = explain(case, calibration)
    r = ex.result
    lines = [f"{case.name}: {case.title}",
             f"  published  {_fmt_s(case.published_s)}  ({case.published}; {case.source}, {case.where})",
             f"  predicted  {_fmt_s(r.predicted_s)}  error {r.error:+.1%}"
             f"  ({'held out' if r.held_out else 'a calibration fit case'}"
             f"{'' if r.calibrated else ', uncalibrated'})"]
    if case.conversion:
        lines.append(f"  conversion {case.conversion}")
    lines.append("where the predicted time goes:")
    total = r.predicted_s or 1.0
    for part, seconds in r.prediction.parts.items():
        if abs(seconds) < 1e-9 * total:
            continue                       # nothing (or float noise) there
        lines.append(f"  {part:32s} {_fmt_s(seconds):>12s}  {seconds / total:6.1%}")
    for note in r.prediction.notes:
        lines.append(f"  - {note}")
    if case.model:
        lines.append(f"  - model: {case.model}")
    if ex.calibration is None:
        lines.append(f"calibration: none for {case.chip}" + (" (--no-calibration)" if not calibration else ""))
    else:
        lines.append(f"sensitivity (each calibrated parameter of {ex.calibration.path} +10%):")
        for s in sorted(ex.sensitivities, key=lambda s: -abs(s.change)):
            basis = s.basis if len(s.basis) <= 110 else s.basis[:107] + "..."
            lines.append(f"  {s.parameter:24s} {s.value:g} -> {s.perturbed:.4g}: prediction {s.change:+.2%}"
                         f"   [{basis}]")
    print("\n".join(lines))
    if args.json:
        _write_json(args.json, ex.to_dict())
    return 0


def _fit(args, cases) -> int:
    from tpusim.validate import find_case
    from tpusim.validate.fit import fit

    if not args.on:
        raise TpusimError("--fit needs --on CASE[,CASE...]: the cases to fit on")
    chosen = [find_case(cases, name.strip()) for name in args.on.split(",") if name.strip()]
    result = fit(args.fit, chosen)
    print(f"{result.parameter} = {result.value:g} for {result.chip} (mean log error zero over "
          f"{len(result.cases)} case(s))")
    for name, error in zip(result.cases, result.errors):
        print(f"  {name}: error {error:+.1%}")
    print(f"write it to topologies/calibration/{result.chip}.toml with fitted_on = {list(result.cases)}")
    return 0


def _leave_one_family_out(args, cases) -> int:
    import statistics

    from tpusim.validate.fit import leave_one_family_out

    selected = [c for c in cases if c.name in set(args.case)] if args.case else list(cases)
    rows = leave_one_family_out([c for c in selected if not (args.fast and c.slow)])
    errors = [e for row in rows for e in row.errors.values()]
    for row in rows:
        chips = "; ".join(f"{chip} mxu_efficiency {value:.4f} from {row.how[chip]}"
                          for chip, value in row.values.items())
        print(f"{row.family}: {chips}")
        for name, error in row.errors.items():
            print(f"  {name:48s} {error:+.1%}")
    if errors:
        print(f"leave-one-family-out ({len(errors)} cases): mean |error| {statistics.fmean(map(abs, errors)):.1%}, "
              f"max {max(map(abs, errors)):.1%}")
    if args.json:
        _write_json(args.json, {"leave_one_family_out": [
            {"family": r.family, "errors": r.errors, "values": r.values, "fitted_on": r.how} for r in rows]})
    return 0


def _write_json(path: str, data: dict) -> None:
    try:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2, sort_keys=False)
            handle.write("\n")
    except OSError as error:
        raise TpusimError(f"cannot write {path}: {error.strerror}") from None
