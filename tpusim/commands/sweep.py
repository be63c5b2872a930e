"""``tpusim sweep REPORT_DIR``: one recording priced over a grid of chips x topologies x slices x eager modes
x placements on Dask (an embedded LocalCluster, or --scheduler / DASK_SCHEDULER_ADDRESS). The work is
tpusim/sweep/; this module is its flags and its terminal output."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tpusim.errors import TpusimError

EXAMPLES = """\
examples:
  python -m tpusim run examples/mlp.py --out reports/mlp
  python -m tpusim sweep reports/mlp --chip v5p,v6e --topology 2d:4x4,3d:4x4x4 --mode strict,fused --out sweeps/mlp
  python -m tpusim sweep reports/mlp --grid grid.toml --workers 4 --out sweeps/mlp
  python -m tpusim sweep reports/gpt --topology 3d:4x4x8 --placement "tp=x,fsdp=yz;tp=z,fsdp=xy" --out sweeps/gpt
  DASK_SCHEDULER_ADDRESS=tcp://10.0.0.5:8786 python -m tpusim sweep reports/mlp --chip v5p,v5e --topology 2d:8x8

A grid file is TOML with any of: chip, topology, slices, mode, placement (lists); flags override it.
Writes sweep.csv, sweep.parquet and sweep.html (plots, Pareto front of step time vs chips) in --out.
Points that cannot exist (v6e has no 3D torus) are rows with status invalid; points whose task failed
after --retries (a killed worker) are rows with status failed and the exit code is 1.
"""


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "sweep", help="price one recording over chips x topologies x slices x modes x placements on Dask",
        description=__doc__.replace("``", ""), epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("report_dir", metavar="REPORT_DIR", help="a folder written by `tpusim run` (program.jsonl)")
    parser.add_argument("--grid", metavar="FILE", help="TOML grid file (chip, topology, slices, mode, placement)")
    parser.add_argument("--chip", help="chip generations, comma list (default: the run's)")
    parser.add_argument("--topology", metavar="SPECS", help="slices, comma list, e.g. 2d:4x4,3d:4x4x4 "
                                                           "(default: the run's)")
    parser.add_argument("--slices", metavar="N,...", help="slices over DCN, comma list (default 1)")
    parser.add_argument("--mode", help="eager modes, comma list or all (default strict)")
    parser.add_argument("--placement", metavar="MAPS", help="placements separated by ';', e.g. "
                                                             "'tp=x,fsdp=yz;default'")
    parser.add_argument("--scheduler", metavar="ADDRESS",
                        help="a running Dask scheduler, e.g. tcp://host:8786 (default: DASK_SCHEDULER_ADDRESS, "
                             "else a local cluster)")
    parser.add_argument("--workers", type=_positive, metavar="N", help="local cluster worker processes (default "
                                                                       "min(4, CPUs))")
    parser.add_argument("--retries", type=int, default=2, metavar="N", help="retries of a failed task (default 2)")
    parser.add_argument("--out", metavar="DIR", help="output folder (default sweeps/<report>-<time>)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(run=run)


def _positive(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return int(text)


def grid_axes(args: argparse.Namespace) -> dict[str, tuple]:
    """The grid from --grid, then each flag given (flags win)."""
    from tpusim.sweep.grid import load_grid_file, split_list

    axes = load_grid_file(args.grid) if args.grid else {}
    for axis, value in (("chips", args.chip), ("topologies", args.topology), ("modes", args.mode),
                        ("slices", args.slices), ("placements", args.placement)):
        if value is not None:
            axes[axis] = split_list(value)
    return axes


def run(args: argparse.Namespace) -> int:
    from tpusim.sweep import load_recording, sweep
    from tpusim.sweep.cluster import progress_bar
    from tpusim.sweep.grid import Grid
    from tpusim.sweep.pareto import pareto_front
    from tpusim.units import format_seconds

    recording = load_recording(args.report_dir)
    axes = grid_axes(args)
    axes.setdefault("chips", (recording.chip,) if recording.chip else ())
    axes.setdefault("topologies", (recording.topology,) if recording.topology else ())
    total = len(Grid(**axes).points())     # bad axes fail here, before a cluster starts
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(args.out) if args.out else Path("sweeps") / f"{Path(recording.folder).name}-{stamp}"
    began = time.perf_counter()
    with progress_bar(total, args.quiet) as bar:
        table = sweep(recording, scheduler=args.scheduler, workers=args.workers, retries=args.retries, out=out,
                      on_row=lambda row: bar.update(1), **axes)
    wall = time.perf_counter() - began
    counts = table["status"].value_counts().to_dict()
    print(f"tpusim sweep: {len(table)} points in {wall:.1f} s: {counts.get('ok', 0)} priced, "
          f"{counts.get('invalid', 0)} invalid, {counts.get('failed', 0)} failed")
    front = pareto_front(table)
    if not front.empty:
        print("Pareto front (step time vs chips):")
        for row in front.itertuples():
            print(f"  {row.chips:>7} chips  {format_seconds(row.step_time_s):>9}  {row.chip} {row.topology}"
                  f"{f' x{row.slices}' if row.slices > 1 else ''} {row.mode} {row.placement}")
    for row in table[table["status"] == "failed"].itertuples():
        print(f"failed: {row.chip} {row.topology} x{row.slices} {row.mode} {row.placement}: {row.error}",
              file=sys.stderr)
    print(f"wrote {out / 'sweep.csv'}, sweep.parquet, sweep.html")
    if not counts.get("ok") and not counts.get("failed"):
        raise TpusimError("no point of the grid can exist (every chip x topology pair is invalid): see "
                          f"{out / 'sweep.html'}")
    return 1 if counts.get("failed") else 0
