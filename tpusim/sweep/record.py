"""Record the script once per combination of its swept arguments, by `tpusim run --numerics off` itself.

Why a `tpusim run` subprocess per combination: it is run's own machinery (the device, the recorder, the
record budget, report.json with tokens/s) with nothing copied, and each recording gets a fresh process,
so one script's torch state never leaks into the next. Why sequentially here, with a progress bar, and
not as Dask tasks: recording needs torch and the user's script, which this machine has and a remote Dask
worker may not (pricing is torch-free and runs anywhere), and each recording already keeps a CPU busy.
A combination whose run fails is returned as its error, so its points become rows saying so.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tpusim.run.options import RunOptions
from tpusim.sweep.script_args import Combination, label, script_argv, tokens_per_step

STDERR_LINES = 6     # the tail of a failed run's stderr kept as the rows' error


@dataclass(frozen=True)
class Recorded:
    """One combination's recording: its report folder, or why there is none."""

    combination: Combination
    folder: Path
    error: str | None = None


def run_command(script: Path, combination: Combination, folder: Path, *, chip: str | None, topology: str | None,
                tokens: int | None, fixed_args: list[str]) -> list[str]:
    """The `tpusim run` command line recording ``combination`` (shape-only, one process for the world)."""
    options = RunOptions(script=str(script), script_args=(*fixed_args, *script_argv(combination)), chip=chip or None,
                         topology=topology or None, numerics="off", ranks="one", tokens_per_step=tokens or None,
                         out=str(folder), quiet=True)
    return options.argv()


def record_one(script: Path, combination: Combination, root: Path, *, chip: str | None = None,
               topology: str | None = None, tokens_expression: str | int | None = None,
               fixed_args: list[str] | None = None, timeout_s: float | None = None) -> Recorded:
    """Record ``combination`` into ``root/<label>``; a failed run (the script raised, bad flags, a timeout)
    is a ``Recorded`` with the error, never an exception."""
    folder = root / label(combination)
    tokens = tokens_per_step(tokens_expression, combination)
    command = run_command(script, combination, folder, chip=chip, topology=topology, tokens=tokens,
                          fixed_args=list(fixed_args or ()))
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return Recorded(combination, folder, f"recording timed out after {timeout_s:g} s")
    if done.returncode != 0 or not (folder / "program.jsonl").is_file():
        tail = [line for line in done.stderr.splitlines() if line.strip()][-STDERR_LINES:]
        why = " | ".join(tail) or f"tpusim run exited with {done.returncode}"
        return Recorded(combination, folder, f"recording failed (exit {done.returncode}): {why}")
    return Recorded(combination, folder)


def record_all(script: Path, combos: list[Combination], root: Path,
               on_done: Callable[[Recorded], None] | None = None, **options) -> list[Recorded]:
    """Each combination recorded in turn (``options`` as ``record_one``'s)."""
    recorded = []
    for combination in combos:
        recorded.append(record_one(script, combination, root, **options))
        if on_done is not None:
            on_done(recorded[-1])
    return recorded
