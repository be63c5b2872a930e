"""Sweeps: one recording priced over a grid of chips x topologies x slices x eager modes x placements on
Dask (``tpusim sweep``, or ``sweep()`` here for a pandas DataFrame).

Map: grid.py (the axes, the points, the TOML grid file), point.py (price one point -> one row: a Dask
task), cluster.py (the Dask client: embedded LocalCluster or a scheduler; tasks, retries, failures as
rows), pareto.py (step time vs chips front), write.py (CSV, Parquet, HTML with plots).
Needs the ``sweep`` extra (dask[distributed], pandas, pyarrow); imported lazily, so tpusim without it
still runs everything else.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpusim.errors import TpusimError
from tpusim.sweep.grid import DEFAULT_PLACEMENT, Grid, Point
from tpusim.trace import Trace

__all__ = ["Grid", "Point", "Recording", "load_recording", "sweep", "DEFAULT_PLACEMENT"]


@dataclass(frozen=True)
class Recording:
    """What a sweep prices: the trace of one `tpusim run`, and what its report says about it."""

    trace: Trace
    folder: Path
    chip: str | None = None            # the run's chip and topology: the grid's defaults
    topology: str | None = None
    tokens_per_step: int | None = None
    script: str = ""


def load_recording(folder: str | Path) -> Recording:
    """A `tpusim run` report folder: its program.jsonl (required) and report.json (optional: defaults)."""
    from tpusim.report.load import load_report
    from tpusim.trace import read_trace

    path = Path(folder)
    program = path / "program.jsonl" if path.is_dir() else path
    if not program.is_file():
        raise TpusimError(f"{str(folder)!r}: no program.jsonl there (give a report folder written by "
                          f"`tpusim run`)")
    trace = read_trace(program)
    if (program.parent / "report.json").is_file():
        report, _ = load_report(program.parent)
        run = report["run"]
        return Recording(trace, program.parent, run["chip"], run["topology"], run.get("tokens_per_step"),
                         run["script"])
    return Recording(trace, program.parent)


def sweep(recording: str | Path | Recording, *, chips: Sequence[str] = (), topologies: Sequence[str] = (),
          modes: Sequence[str] = ("strict",), slices: Sequence[int] = (1,),
          placements: Sequence[str] = (DEFAULT_PLACEMENT,), scheduler: str | None = None,
          workers: int | None = None, retries: int = 2, out: str | Path | None = None, client: Any = None,
          on_row: Callable[[dict[str, Any]], None] | None = None) -> Any:
    """Price ``recording`` over the grid on Dask; returns the table as a pandas DataFrame (one row per point,
    ``status`` ok / invalid / failed, a ``pareto`` column), also written to ``out`` when given.

    ``chips``/``topologies`` default to the recording's own; ``client``: an existing distributed.Client,
    else ``scheduler`` (or DASK_SCHEDULER_ADDRESS), else an embedded LocalCluster of ``workers`` processes."""
    from tpusim.sweep.cluster import dask_client, run_points
    from tpusim.sweep.write import sweep_table, write_sweep

    rec = recording if isinstance(recording, Recording) else load_recording(recording)
    grid = Grid(tuple(chips) or _own(rec.chip, "chips"), tuple(topologies) or _own(rec.topology, "topologies"),
                tuple(modes), tuple(slices), tuple(placements))
    points = grid.points()
    if client is not None:
        rows = run_points(client, rec.trace, points, rec.tokens_per_step, retries, on_row)
    else:
        with dask_client(scheduler, workers) as own:
            rows = run_points(own, rec.trace, points, rec.tokens_per_step, retries, on_row)
    table = sweep_table(rows)
    if out is not None:
        from tpusim.output import prepare_folder

        write_sweep(table, prepare_folder(out), f"tpusim sweep of {rec.script or rec.folder}")
    return table


def _own(value: str | None, axis: str) -> tuple[str, ...]:
    if value is None:
        raise TpusimError(f"give {axis}: the recording has no report.json to take the run's own from")
    return (value,)
