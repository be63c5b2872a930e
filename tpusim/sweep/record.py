"""Record the script once per combination of its swept arguments, by `tpusim run --numerics off` itself.

Why a `tpusim run` subprocess per combination: it is run's own machinery (the device, the recorder, the
record budget, report.json with tokens/s) with nothing copied, and each recording gets a fresh process,
so one script's torch state never leaks into the next. Why sequentially here, with a progress bar, and
not as Dask tasks: recording needs torch and the user's script, which this machine has and a remote Dask
worker may not (pricing is torch-free and runs anywhere), and each recording already keeps a CPU busy.
A combination whose run fails is returned as its error, so its points become rows saying so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tpusim.run.fresh import run_fresh
from tpusim.run.options import RunOptions
from tpusim.sweep.script_args import Combination, label, script_argv, tokens_per_step


@dataclass(frozen=True)
class Recorded:
    """One combination's recording: its report folder, or why there is none."""

    combination: Combination
    folder: Path
    error: str | None = None


def run_options(script: Path, combination: Combination, folder: Path, *, chip: str | None, topology: str | None,
                tokens: int | None, fixed_args: list[str]) -> RunOptions:
    """The `tpusim run` recording ``combination`` (shape-only, one process for the world)."""
    return RunOptions(script=str(script), script_args=(*fixed_args, *script_argv(combination)), chip=chip or None,
                      topology=topology or None, numerics="off", ranks="one", tokens_per_step=tokens or None,
                      out=str(folder), quiet=True)


def run_command(script: Path, combination: Combination, folder: Path, **given) -> list[str]:
    """The `tpusim run` command line recording ``combination`` (``given`` as ``run_options``')."""
    return run_options(script, combination, folder, **given).argv()


def record_one(script: Path, combination: Combination, root: Path, *, chip: str | None = None,
               topology: str | None = None, tokens_expression: str | int | None = None,
               fixed_args: list[str] | None = None, timeout_s: float | None = None) -> Recorded:
    """Record ``combination`` into ``root/<label>``; a failed run (the script raised, bad flags, a timeout)
    is a ``Recorded`` with the error, never an exception."""
    folder = root / label(combination)
    tokens = tokens_per_step(tokens_expression, combination)
    options = run_options(script, combination, folder, chip=chip, topology=topology, tokens=tokens,
                          fixed_args=list(fixed_args or ()))
    return Recorded(combination, folder, run_fresh(options, timeout_s=timeout_s))


def record_all(script: Path, combos: list[Combination], root: Path,
               on_done: Callable[[Recorded], None] | None = None, **options) -> list[Recorded]:
    """Each combination recorded in turn (``options`` as ``record_one``'s)."""
    recorded = []
    for combination in combos:
        recorded.append(record_one(script, combination, root, **options))
        if on_done is not None:
            on_done(recorded[-1])
    return recorded
