"""The validated error band of each mode: how far `tpusim validate`'s held-out product cases of that mode land.

Why: the report prints a step time per eager mode; a user needs to know how far each one has been found from real
TPUs. ``mode_bands(results)`` groups the held-out product-path cases by the mode their published run used (a case's
``mode``: "compile", "fused", "strict") and gives each mode's case count and mean and max |error|;
``write_bands`` writes them to ``topologies/fidelity/error_bands.toml`` (`tpusim validate --write-bands`), which
the report reads (tpusim/report/fidelity.py), for the modes all of whose cases the run priced (``complete_modes``):
a band from some of a mode's cases would claim more than was checked.
"""

from __future__ import annotations

import datetime
import tomllib
from pathlib import Path

from tpusim.hardware.calibration import band_key, error_bands_path
from tpusim.output import write_atomic
from tpusim.validate.case import Case
from tpusim.validate.suite import Result, summary_of


def case_key(case: Case) -> str:
    """The band a product case counts towards: its mode, and the compiler path it was priced through."""
    return band_key(case.mode or "compile", case.compiler or "model")


def mode_bands(results: list[Result]) -> dict[str, dict]:
    """Per mode and compiler path (``case_key``): {cases, mean_abs_error, max_abs_error, worst} over the held-out
    measured product-path cases."""
    by_mode: dict[str, list[Result]] = {}
    for r in results:
        if r.case.kind == "measured" and r.case.path == "product" and r.held_out:
            by_mode.setdefault(case_key(r.case), []).append(r)
    bands = {}
    for mode, rs in sorted(by_mode.items()):
        s = summary_of(mode, rs)
        bands[mode] = {"cases": s.count, "mean_abs_error": s.mean_abs, "max_abs_error": s.max_abs, "worst": s.worst}
    return bands


def complete_modes(results: list[Result], cases: list[Case]) -> set[str]:
    """The modes every one of whose measured product-path cases (of ``cases``, the whole suite) was priced in
    ``results``: only their bands may be written (a band from some of a mode's cases would claim more than was
    checked)."""
    ran = {r.case.name for r in results}
    modes: dict[str, set[str]] = {}
    for c in cases:
        if c.kind == "measured" and c.path == "product":
            modes.setdefault(case_key(c), set()).add(c.name)
    return {mode for mode, names in modes.items() if names <= ran}


def write_bands(results: list[Result], modes: set[str], path: Path | None = None) -> Path:
    """Write ``mode_bands(results)`` of ``modes`` as TOML (one table a mode, with the date it was measured); the
    file's other modes stay as they were measured before."""
    path = path or error_bands_path()
    try:
        kept = {m: b for m, b in tomllib.loads(path.read_text()).items() if isinstance(b, dict) and m not in modes}
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        kept = {}
    today = datetime.date.today().isoformat()
    fresh = {m: {**b, "measured": today} for m, b in mode_bands(results).items() if m in modes}
    lines = ["# The validated error of each mode: mean and max |error| of `tpusim validate`'s held-out product-path",
             "# cases whose published run used that mode (compile: torch.compile'd, the rest in an eager mode;",
             "# fused / strict: the whole step in that eager mode), priced by tpusim's model; \"MODE@xla\": the same",
             "# cases priced through the TPU compiler's programs (--compiler xla). Written by `python -m tpusim",
             "# validate --write-bands` (tpusim/validate/bands.py) for each band all of whose cases it priced; read",
             "# by the report (tpusim/report/fidelity.py) and by --compiler auto (tpusim/xla/programs.py).",
             "# Adding a mode = one table here, written by that command.", ""]
    for mode, band in sorted({**kept, **fresh}.items()):
        table = f"[\"{mode}\"]" if "@" in mode else f"[{mode}]"        # compile@xla: a quoted key
        lines += [table, f"cases = {int(band['cases'])}", f"mean_abs_error = {float(band['mean_abs_error']):.4f}",
                  f"max_abs_error = {float(band['max_abs_error']):.4f}", f"worst = \"{band['worst']}\"",
                  f"measured = \"{band.get('measured', '')}\"", ""]
    write_atomic(path, "\n".join(lines))
    return path
