"""One `tpusim run` in a fresh process, as ``RunOptions`` ask for it: how `tpusim sweep` records each
combination of the script's arguments and how ``--fit-batch`` records each batch it tries.

Why a subprocess: it is run's own machinery (the device, the recorder, the record budget, report.json)
with nothing copied, and each recording gets a fresh process, so one recording's torch state never
leaks into the next. Why here and not in tpusim/sweep: the run pipeline (``--fit-batch``) needs it too,
and the sweep sits above the run layer.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path

from tpusim.run.options import RunOptions

STDERR_LINES = 6     # the tail of a failed run's stderr kept as its error


def run_fresh(options: RunOptions, *, timeout_s: float | None = None, env: Mapping[str, str] | None = None,
              cwd: str | Path | None = None) -> str | None:
    """Run ``options`` (``out`` set) in a fresh `python -m tpusim run`; None when it exited 0 and kept its
    recording in ``options.out``, else why not, in one line (the tail of its stderr). Never raises for a
    run that failed or timed out."""
    try:
        done = subprocess.run(options.argv(), capture_output=True, text=True, timeout=timeout_s,
                              env=None if env is None else dict(env), cwd=cwd)
    except subprocess.TimeoutExpired:
        return f"recording timed out after {timeout_s:g} s"
    if done.returncode != 0 or not (Path(cwd or ".") / str(options.out) / "program.jsonl").is_file():
        tail = [line for line in done.stderr.splitlines() if line.strip()][-STDERR_LINES:]
        why = " | ".join(tail) or f"tpusim run exited with {done.returncode}"
        return f"recording failed (exit {done.returncode}): {why}"
    return None
