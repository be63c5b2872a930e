"""The validated error band of each mode: how far `tpusim validate`'s held-out product cases of that mode land.

Why: the report prints a step time per eager mode; a user needs to know how far each one has been found from real
TPUs. ``mode_bands(results)`` groups the held-out product-path cases by the mode their published run used (a case's
``mode``: "compile", "fused", "strict") and gives each mode's case count and mean and max |error|;
``write_bands`` writes them to ``topologies/calibration/error_bands.toml`` (`tpusim validate --write-bands`), which
the report reads (tpusim/report/fidelity.py). Only a whole run may write it: a band from a subset of the cases would
claim more than was checked.
"""

from __future__ import annotations

import datetime
import statistics
from pathlib import Path

from tpusim.hardware.calibration import calibration_dir
from tpusim.output import write_atomic
from tpusim.validate.suite import Result

BANDS_FILE = "error_bands.toml"


def mode_bands(results: list[Result]) -> dict[str, dict]:
    """Per mode: {cases, mean_abs_error, max_abs_error, worst} over the held-out measured product-path cases."""
    by_mode: dict[str, list[Result]] = {}
    for r in results:
        if r.case.kind == "measured" and r.case.path == "product" and r.held_out and r.case.compiler != "xla":
            by_mode.setdefault(r.case.mode or "compile", []).append(r)
    bands = {}
    for mode, rs in sorted(by_mode.items()):
        worst = max(rs, key=lambda r: abs(r.error))
        bands[mode] = {"cases": len(rs), "mean_abs_error": statistics.fmean(abs(r.error) for r in rs),
                       "max_abs_error": abs(worst.error), "worst": worst.case.name}
    return bands


def bands_path() -> Path:
    return calibration_dir() / BANDS_FILE


def write_bands(results: list[Result], path: Path | None = None) -> Path:
    """Write ``mode_bands(results)`` as TOML (one table a mode), with the date it was measured."""
    path = path or bands_path()
    lines = ["# The validated error of each mode: mean and max |error| of `tpusim validate`'s held-out product-path",
             "# cases whose published run used that mode (compile: torch.compile'd, the rest in an eager mode;",
             "# fused / strict: the whole step in that eager mode). Written by `python -m tpusim validate",
             f"# --write-bands` on {datetime.date.today().isoformat()} (tpusim/validate/bands.py); read by the report",
             "# (tpusim/report/fidelity.py). Adding a mode = one table here, written by that command.", ""]
    for mode, band in mode_bands(results).items():
        lines += [f"[{mode}]", f"cases = {band['cases']}", f"mean_abs_error = {band['mean_abs_error']:.4f}",
                  f"max_abs_error = {band['max_abs_error']:.4f}", f"worst = \"{band['worst']}\"", ""]
    write_atomic(path, "\n".join(lines))
    return path
