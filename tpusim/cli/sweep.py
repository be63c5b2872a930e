"""``tpusim sweep``'s flags and terminal output (the work is tpusim/sweep/)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tpusim.errors import TpusimError
from tpusim.units import ascii_whole

EXAMPLES = """\
examples:
  python -m tpusim run examples/mlp.py --out reports/mlp
  python -m tpusim sweep reports/mlp --chip v5p,v6e --topology 2d:4x4,3d:4x4x4 --mode strict,fused --out sweeps/mlp
  python -m tpusim sweep reports/mlp --grid grid.toml --workers 4 --out sweeps/mlp
  python -m tpusim sweep reports/gpt --topology 3d:4x4x8 --placement "tp=x,fsdp=yz;tp=z,fsdp=xy" --out sweeps/gpt
  DASK_SCHEDULER_ADDRESS=tcp://10.0.0.5:8786 python -m tpusim sweep reports/mlp --chip v5p,v5e --topology 2d:8x8
  python -m tpusim sweep examples/transformer.py --script-arg batch=4,16 --script-arg seq=64,128 \
      --tokens-per-step batch*seq --chip v5p --topology 3d:2x2x2,3d:4x4x4 --out sweeps/transformer

With SCRIPT (a .py file) and --script-arg NAME=V1,V2 (repeatable): each combination of the values is
recorded once by `tpusim run SCRIPT --numerics off -- --NAME V ...` (in turn, under sweeps' --out
recordings/), then every grid point is priced against it; the table gets one column per script argument,
and a combination whose recording failed is one failed row per point. Arguments after -- go to every run.

A grid file is TOML with any of: chip, topology, slices, mode, placement (lists), tokens_per_step, and a
[script_args] table (batch = [4, 16]); flags override it.
Writes sweep.csv, sweep.parquet and sweep.html (plots, Pareto front of step time vs chips) in --out.
Points that cannot exist (v6e has no 3D torus) are rows with status invalid; points whose task failed
after --retries (a killed worker) are rows with status failed and the exit code is 1; when the scheduler is
lost, the points not yet priced are rows with status pending (exit code 1) beside every row already priced.
Points go to the cluster 512 at a time, so any grid runs in bounded memory.
"""


DESCRIPTION = """\
tpusim sweep REPORT_DIR: price one recorded run over a grid of chips x topologies x slices x eager modes x
placements, in parallel on Dask (a local cluster, or --scheduler / DASK_SCHEDULER_ADDRESS), without running
the script again. tpusim sweep SCRIPT --script-arg batch=4,16: record the script once per combination
of its swept arguments, then price each recording over the grid."""


def add_parser(subparsers) -> None:
    from tpusim.hardware.calibration import add_calibration_argument
    from tpusim.xla.programs import COMPILERS

    parser = subparsers.add_parser(
        "sweep", help="price one recording over chips x topologies x slices x modes x placements on Dask",
        description=DESCRIPTION, epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("report_dir", metavar="REPORT_DIR|SCRIPT",
                        help="a folder written by `tpusim run` (program.jsonl), or a script to record per "
                             "--script-arg combination")
    parser.add_argument("--script-arg", action="append", metavar="NAME=V1,V2", dest="script_arg",
                        help="sweep the script's --NAME over these values (repeatable; SCRIPT only)")
    parser.add_argument("--tokens-per-step", metavar="EXPR",
                        help="tokens per step for tokens/s, e.g. batch*seq or 8192 (SCRIPT only)")
    parser.add_argument("--grid", metavar="FILE", help="TOML grid file (chip, topology, slices, mode, placement)")
    parser.add_argument("--chip", help="chip generations, comma list (default: the run's)")
    parser.add_argument("--topology", metavar="SPECS", help="slices, comma list, e.g. 2d:4x4,3d:4x4x4 "
                                                           "(default: the run's)")
    parser.add_argument("--slices", metavar="N,...", help="slices over DCN, comma list (default 1)")
    parser.add_argument("--mode", help="eager modes, comma list or all (default strict)")
    parser.add_argument("--placement", metavar="MAPS", help="placements separated by ';', e.g. "
                                                             "'tp=x,fsdp=yz;default'")
    add_calibration_argument(parser)
    parser.add_argument("--compiler", choices=COMPILERS, default="auto",
                        help="what prices a compiled program, as `tpusim run --compiler` (default auto: the TPU "
                             "compiler where the xla extra is installed, else tpusim's model)")
    parser.add_argument("--scheduler", metavar="ADDRESS",
                        help="a running Dask scheduler, e.g. tcp://host:8786 (default: DASK_SCHEDULER_ADDRESS, "
                             "else a local cluster)")
    parser.add_argument("--workers", type=_positive, metavar="N", help="local cluster worker processes (default "
                                                                       "min(4, CPUs))")
    parser.add_argument("--retries", type=_whole, default=2, metavar="N", help="retries of a failed task (default 2)")
    parser.add_argument("--out", metavar="DIR", help="output folder (default sweeps/<report>-<time>)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(run=run, script_args=[])


def _whole(text: str) -> int:
    if not ascii_whole(text.strip()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 0")
    return int(text)


def _positive(text: str) -> int:
    if not ascii_whole(text.strip()) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return int(text)


def _utf8(value: str, axis: str) -> str:
    """A flag's value as text every file of the sweep can hold: bytes that are not UTF-8 (Python keeps them as
    lone surrogates) are refused here, not by pyarrow writing sweep.parquet after the whole sweep (issue 44)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as error:
        flag = {"chips": "chip", "topologies": "topology", "modes": "mode", "placements": "placement"}.get(axis, axis)
        raise TpusimError(f"--{flag} {value.encode('utf-8', 'surrogateescape')!r}: not UTF-8 text "
                          f"(byte 0x{ord(value[error.start]) & 0xFF:02x} at offset {error.start})") from None
    return value


def grid_axes(args: argparse.Namespace) -> dict[str, tuple]:
    """The grid from --grid, then each flag given (flags win)."""
    from tpusim.sweep.grid import load_grid_file, split_list

    axes = load_grid_file(args.grid) if args.grid else {}
    for axis, value in (("chips", args.chip), ("topologies", args.topology), ("modes", args.mode),
                        ("slices", args.slices), ("placements", args.placement)):
        if value is not None:
            axes[axis] = split_list(_utf8(value, axis))
    if args.no_calibration:
        axes["calibrations"] = (False,)
    return axes


def script_settings(args: argparse.Namespace, axes: dict[str, tuple]) -> tuple[dict[str, tuple], object]:
    """The script-argument axes (--grid's [script_args], then each --script-arg) and tokens per step; pops
    them from ``axes`` so what is left is the Grid's."""
    from tpusim.sweep.script_args import parse_script_arg, script_axes

    script = script_axes(axes.pop("script_args", ()))
    tokens = (axes.pop("tokens_per_step", None) or (None,))[0]
    for text in args.script_arg or ():
        name, values = parse_script_arg(text)
        script[name] = values
    return script, args.tokens_per_step if args.tokens_per_step is not None else tokens


def run(args: argparse.Namespace) -> int:
    from tpusim.sweep import load_recording, sweep
    from tpusim.sweep.cluster import progress_bar, require_dask
    from tpusim.sweep.grid import Grid

    require_dask()                          # before a bar or a recording: an error first, not an empty bar
    axes = grid_axes(args)
    script_axes, tokens = script_settings(args, axes)
    if script_axes or Path(args.report_dir).suffix == ".py":
        return _run_script(args, axes, script_axes, tokens)
    if args.script_args or args.tokens_per_step is not None:
        raise TpusimError("--tokens-per-step and arguments after -- are for a SCRIPT sweep (with --script-arg); "
                          "a REPORT_DIR's recording has its own")
    recording = load_recording(args.report_dir)
    axes.setdefault("chips", (recording.chip,) if recording.chip else ())
    axes.setdefault("topologies", (recording.topology,) if recording.topology else ())
    total = len(Grid(**axes).points())     # bad axes fail here, before a cluster starts
    out = _out(args, Path(recording.folder).name)
    began = time.perf_counter()
    with progress_bar(total, args.quiet) as bar:
        table = sweep(recording, scheduler=args.scheduler, workers=args.workers, retries=args.retries, out=out,
                      on_row=lambda row: bar.update(1), compiler=args.compiler, **axes)
    return _summary(table, out, time.perf_counter() - began)


def _run_script(args: argparse.Namespace, axes: dict[str, tuple], script_axes: dict[str, tuple],
                tokens: object) -> int:
    """SCRIPT --script-arg ...: record each combination (a bar), then price every point (a second bar)."""
    from tqdm import tqdm

    from tpusim.script import check_script
    from tpusim.sweep import sweep_script
    from tpusim.sweep.grid import Grid
    from tpusim.sweep.script_args import combinations

    script = check_script(args.report_dir)
    if not script_axes:
        raise TpusimError(f"{args.report_dir}: a script sweep needs --script-arg NAME=V1,V2 (or [script_args] in "
                          f"--grid); to price one recording, give the folder `tpusim run` wrote")
    combos = len(combinations(script_axes))
    per_recording = len(Grid(**axes).points()) if "chips" in axes and "topologies" in axes else None
    out = _out(args, script.stem)
    began = time.perf_counter()
    with tqdm(total=combos, unit="recording", desc="recording", file=sys.stderr, disable=args.quiet) as recorded:
        bars = {}

        def on_row(row: dict) -> None:
            if "bar" not in bars:
                recorded.close()
                total = combos * per_recording if per_recording else None
                bars["bar"] = tqdm(total=total, unit="point", desc="pricing", file=sys.stderr, disable=args.quiet)
            bars["bar"].update(1)

        try:
            table = sweep_script(script, script_axes, tokens_per_step=tokens, fixed_args=list(args.script_args),
                                 scheduler=args.scheduler, workers=args.workers, retries=args.retries, out=out,
                                 on_recorded=lambda r: recorded.update(1), on_row=on_row, compiler=args.compiler,
                                 **axes)
        finally:
            if "bar" in bars:
                bars["bar"].close()
    recordings = table.drop_duplicates("recording")
    for row in recordings.itertuples():
        if row.status == "failed" and str(row.error).startswith("recording"):
            print(f"failed: {row.recording}: {row.error}", file=sys.stderr)
    return _summary(table, out, time.perf_counter() - began)


def _invalid_reasons(table, shown: int = 3) -> str:
    """Why the grid's points are invalid, each distinct reason once (the first ``shown``), for the one error line:
    "every chip x topology pair is invalid" alone hid a bad placement or a topology that is no text (W02, W17)."""
    reasons = list(dict.fromkeys(str(e) for e in table.loc[table["status"] == "invalid", "error"]))
    more = f"; and {len(reasons) - shown} more reasons" if len(reasons) > shown else ""
    return "; ".join(reasons[:shown]) + more


def _out(args: argparse.Namespace, name: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(args.out) if args.out else Path("sweeps") / f"{name}-{stamp}"


def _summary(table, out: Path, wall: float) -> int:
    """The counts, the Pareto front (one per combination of script arguments), the failures; the exit code."""
    from tpusim.sweep.pareto import pareto_front
    from tpusim.sweep.write import idle_note, script_columns_of, serving_front_lines
    from tpusim.units import format_seconds

    counts = table["status"].value_counts().to_dict()
    print(f"tpusim sweep: {len(table)} points in {wall:.1f} s: {counts.get('ok', 0)} priced, "
          f"{counts.get('invalid', 0)} invalid, {counts.get('failed', 0)} failed"
          + (f", {counts['pending']} pending (the scheduler was lost; the rows priced before are written)"
             if counts.get("pending") else ""))
    script = script_columns_of(table)
    if note := idle_note(table):
        print(f"note: {note}")
    front = pareto_front(table)
    if not front.empty:
        print("Pareto front (step time vs chips" + (f", per {', '.join(script)}" if script else "") + "):")
        rows = front.sort_values([*script, "chips", "step_time_s"]).to_dict("records")
        givens = [" ".join(f"{name}={row[name]}" for name in script) for row in rows]
        width = max(map(len, givens))
        for row, given in zip(rows, givens):
            slices = f" x{row['slices']}" if row["slices"] > 1 else ""
            used = f" ({row['chips_used']} used)" if row["chips_used"] != row["chips"] else ""
            print(f"  {given.ljust(width) + '  ' if given else ''}{row['chips']:>7} chips{used}  "
                  f"{format_seconds(row['step_time_s']):>9}  {row['chip']} {row['topology']}{slices} "
                  f"{row['mode']} {row['placement']}")
    for line in serving_front_lines(table):         # inference programs: throughput against time per token
        print(line)
    for row in table[table["status"] == "failed"].to_dict("records"):
        given = "".join(f" {name}={row[name]}" for name in script)
        print(f"failed: {row['chip']} {row['topology']} x{row['slices']} {row['mode']} {row['placement']}{given}: "
              f"{row['error']}", file=sys.stderr)
    print(f"wrote {out / 'sweep.csv'}, sweep.parquet, sweep.html")
    if not counts.get("ok") and not counts.get("failed") and not counts.get("pending"):
        raise TpusimError(f"no point of the grid can exist: {_invalid_reasons(table)} "
                          f"(every row in {out / 'sweep.csv'})")
    return 1 if counts.get("failed") or counts.get("pending") else 0
