"""Sweeps: one recording priced over a grid of chips x topologies x slices x eager modes x placements on
Dask (``tpusim sweep``, or ``sweep()`` here for a pandas DataFrame).

Map: grid.py (the axes, the points, the TOML grid file), point.py (price one point -> one row: a Dask
task), cluster.py (the Dask client: embedded LocalCluster or a scheduler; tasks, retries, failures as
rows), pareto.py (step time vs chips front), write.py (CSV, Parquet, HTML with plots); script_args.py and
record.py: the axis over the script's own arguments (batch size, sequence length), one recording each.
Needs the ``sweep`` extra (dask[distributed], pandas, pyarrow); imported lazily, so tpusim without it
still runs everything else.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpusim.errors import TpusimError
from tpusim.sweep.grid import DEFAULT_PLACEMENT, Grid, Point
from tpusim.trace.records import Trace

__all__ = ["Grid", "Point", "Recording", "load_recording", "sweep", "sweep_script", "DEFAULT_PLACEMENT"]


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
    from tpusim.trace.records import read_trace

    path = Path(folder)
    program = path / "program.jsonl" if path.is_dir() else path
    if not program.is_file():
        raise TpusimError(f"{str(folder)!r}: no program.jsonl there (give a report folder written by "
                          f"`tpusim run`)")
    trace = read_trace(program)
    if (program.parent / "report.json").is_file():
        report, _ = load_report(program.parent)
        run = report.run
        return Recording(trace, program.parent, run.chip, run.topology, run.tokens_per_step, run.script)
    return Recording(trace, program.parent)


def sweep(recording: str | Path | Recording, *, chips: Sequence[str] = (), topologies: Sequence[str] = (),
          modes: Sequence[str] = ("strict",), slices: Sequence[int] = (1,),
          placements: Sequence[str] = (DEFAULT_PLACEMENT,), calibrations: Sequence[bool] = (True,),
          scheduler: str | None = None,
          workers: int | None = None, retries: int = 2, out: str | Path | None = None, client: Any = None,
          on_row: Callable[[dict[str, Any]], None] | None = None, compiler: str = "auto") -> Any:
    """Price ``recording`` over the grid on Dask; returns the table as a pandas DataFrame (one row per point,
    ``status`` ok / invalid / failed, a ``pareto`` column), also written to ``out`` when given.

    ``chips``/``topologies`` default to the recording's own; ``calibrations``: (True,) prices each chip with its
    calibration (topologies/calibration/), (False,) the datasheet chip; ``client``: an existing distributed.Client,
    else ``scheduler`` (or DASK_SCHEDULER_ADDRESS), else an embedded LocalCluster of ``workers`` processes;
    ``compiler``: `tpusim run`'s --compiler (auto, xla, model), so each point prices what run would."""
    from tpusim.sweep.cluster import dask_client, run_points
    from tpusim.sweep.write import sweep_table, write_sweep

    pricer = _pricer(compiler)
    rec = recording if isinstance(recording, Recording) else load_recording(recording)
    grid = Grid(tuple(chips) or _own(rec.chip, "chips"), tuple(topologies) or _own(rec.topology, "topologies"),
                tuple(modes), tuple(slices), tuple(placements), tuple(calibrations))
    points = grid.points()
    if client is not None:
        rows = run_points(client, rec.trace, points, rec.tokens_per_step, retries, on_row, price=pricer)
    else:
        with dask_client(scheduler, workers) as own:
            rows = run_points(own, rec.trace, points, rec.tokens_per_step, retries, on_row, price=pricer)
    table = sweep_table(rows)
    if out is not None:
        from tpusim.output import prepare_folder

        write_sweep(table, prepare_folder(out), f"tpusim sweep of {rec.script or rec.folder}")
    return table


def _pricer(compiler: str) -> Callable[..., dict[str, Any]]:
    """A point's pricer for ``compiler`` (refused at once when unknown, or xla without the extra)."""
    from tpusim.pricing.compiled import check_compiler
    from tpusim.sweep.point import price_point

    check_compiler(compiler, "compiler")
    return functools.partial(price_point, compiler=compiler)


def _own(value: str | None, axis: str) -> tuple[str, ...]:
    if value is None:
        raise TpusimError(f"give {axis}: the recording has no report.json to take the run's own from")
    return (value,)


def sweep_script(script: str | Path, script_args: Mapping[str, Sequence[object]], *, chips: Sequence[str] = (),
                 topologies: Sequence[str] = (), modes: Sequence[str] = ("strict",), slices: Sequence[int] = (1,),
                 placements: Sequence[str] = (DEFAULT_PLACEMENT,), calibrations: Sequence[bool] = (True,),
                 tokens_per_step: str | int | None = None,
                 fixed_args: Sequence[str] = (), scheduler: str | None = None, workers: int | None = None,
                 retries: int = 2, out: str | Path | None = None, client: Any = None,
                 on_recorded: Callable[[Any], None] | None = None,
                 on_row: Callable[[dict[str, Any]], None] | None = None, compiler: str = "auto") -> Any:
    """Record ``script`` once per combination of ``script_args`` (e.g. ``{"batch-size": [8, 16]}`` -> runs
    with ``--batch-size 8``, then 16) and price each recording over the grid; the table has one column per
    script argument. ``tokens_per_step``: ``"batch-size*seq-len"`` (names of script arguments and whole
    numbers) gives tokens/s. A combination whose recording failed is one "failed" row per grid point.
    Recordings are kept under ``out``/recordings (when ``out`` is None, in a temporary folder deleted on
    return, so the ``recording`` column then names folders that are gone)."""
    import tempfile

    from tpusim.script import check_script
    from tpusim.sweep.cluster import dask_client, failed_row, run_points
    from tpusim.sweep.record import record_all
    from tpusim.sweep.script_args import combinations, script_axes, typed
    from tpusim.sweep.script_args import tokens_per_step as tokens_of
    from tpusim.sweep.write import sweep_table, write_sweep

    path = check_script(str(script))
    pricer = _pricer(compiler)
    axes = script_axes(script_args)
    if not axes:
        raise TpusimError("give at least one script argument to sweep, e.g. --script-arg batch-size=8,16")
    combos = combinations(axes)
    for combination in combos:            # a bad --tokens-per-step fails here, before anything runs
        tokens_of(tokens_per_step, combination)
    chips, topologies = tuple(chips), tuple(topologies)
    if chips and topologies:
        Grid(chips, topologies, tuple(modes), tuple(slices), tuple(placements))   # bad axes fail before recording
    with tempfile.TemporaryDirectory(prefix="tpusim-sweep-") as scratch:
        root = Path(out) / "recordings" if out is not None else Path(scratch)
        recorded = record_all(path, combos, root, on_done=on_recorded, chip=chips[0] if chips else None,
                              topology=topologies[0] if topologies else None, tokens_expression=tokens_per_step,
                              fixed_args=list(fixed_args))
        good = [load_recording(r.folder) for r in recorded if r.error is None]
        first = good[0] if good else None
        if first is None and not (chips and topologies):
            raise TpusimError(f"every recording failed, so there is no run to take the grid's chips and topologies "
                              f"from (give --chip and --topology to get one failed row per point); the first: "
                              f"{recorded[0].error}")
        grid = Grid(chips or _own(first and first.chip, "chips"),
                    topologies or _own(first and first.topology, "topologies"),
                    tuple(modes), tuple(slices), tuple(placements), tuple(calibrations))
        points = grid.points()
        rows: list[dict[str, Any]] = []

        def price_all(dask: Any) -> None:
            loaded = iter(good)
            for outcome in recorded:
                columns = {name: typed(value) for name, value in outcome.combination}
                columns["recording"] = str(outcome.folder)
                if outcome.error is not None:
                    for point in points:
                        row = {**failed_row(point, outcome.error), **columns}
                        rows.append(row)
                        if on_row is not None:
                            on_row(row)
                    continue
                rec = next(loaded)
                rows.extend({**row, **columns} for row in run_points(
                    dask, rec.trace, points, rec.tokens_per_step, retries, on_row, price=pricer))

        if client is not None:
            price_all(client)
        else:
            with dask_client(scheduler, workers) as own:
                price_all(own)
    table = sweep_table(rows, script_columns=tuple(axes))
    if out is not None:
        from tpusim.output import prepare_folder

        write_sweep(table, prepare_folder(out), f"tpusim sweep of {path.name} over {', '.join(axes)}")
    return table
