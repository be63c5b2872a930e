"""How far each mode's step time has been found from real TPUs: the mode's validated error band.

Why: a step time is only as good as the cases it was checked on. `tpusim validate --write-bands` writes, per mode a
published run used ("compile", "fused", "strict"), the mean and max |error| of its held-out product-path cases to
topologies/fidelity/error_bands.toml (tpusim/validate/bands.py); each mode of a report carries the band it
was validated as: "compile" where the program ran torch.compile'd graphs (the published compiled runs time such a
script), else the eager mode itself. A mode without a measured band says so ("no band"), never a borrowed one.
"""

from __future__ import annotations

import functools
import tomllib

from tpusim.hardware.calibration import error_bands_path
from tpusim.trace.records import OpRecord, Trace


@functools.cache
def bands() -> dict[str, dict]:
    """The bands file's tables by mode ({} when it is missing or unreadable: every mode "not validated")."""
    try:
        data = tomllib.loads(error_bands_path().read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return {}
    return {mode: band for mode, band in data.items() if isinstance(band, dict)}


def compiled(trace: Trace) -> bool:
    """Whether the program ran torch.compile'd graphs."""
    return any(op.program > 0 for op in trace.of_kind(OpRecord))


def fidelity(mode: str, ran_compiled: bool) -> dict:
    """report.json's modes.<mode>.fidelity: the band the mode was validated as (cases 0: none)."""
    key = "compile" if ran_compiled else mode
    band = bands().get(key, {})
    cases = int(band.get("cases", 0))
    return {"validated_as": key, "cases": cases,
            "mean_abs_error": float(band["mean_abs_error"]) if cases else None,
            "max_abs_error": float(band["max_abs_error"]) if cases else None}


def band_text(validated_as: str, cases: int, mean: float | None, worst: float | None) -> str:
    """One cell: "±4.5% (max 10.3%, 13 compile cases)", or "no band (strict)" where none was measured."""
    if not cases or mean is None or worst is None:
        return f"no band ({validated_as})"
    return f"±{mean:.1%} (max {worst:.1%}, {cases} {validated_as} case{'s' if cases != 1 else ''})"
