"""How far each mode's step time has been found from real TPUs: the mode's validated error band.

Why: a step time is only as good as the cases it was checked on. `tpusim validate --write-bands` writes, per mode a
published run used ("compile", "fused", "strict"), the mean and max |error| of its held-out product-path cases to
topologies/fidelity/error_bands.toml (tpusim/validate/bands.py); each mode of a report carries the band it
was validated as: "compile" where the program ran torch.compile'd graphs (the published compiled runs time such a
script), else the eager mode itself. A mode without a measured band says so ("no band"), never a borrowed one.
"""

from __future__ import annotations

from tpusim.hardware.calibration import band_key, error_bands
from tpusim.trace.records import OpRecord, Trace


def compiled(trace: Trace) -> bool:
    """Whether the program ran torch.compile'd graphs."""
    return any(op.program > 0 for op in trace.of_kind(OpRecord))


def fidelity(mode: str, ran_compiled: bool, compiler: str = "model") -> dict:
    """report.json's modes.<mode>.fidelity: the band the mode was validated as, through the compiler path that
    priced it ("compile@xla" where the TPU compiler built the programs; cases 0: none)."""
    key = band_key("compile" if ran_compiled else mode, compiler)
    band = error_bands().get(key, {})
    cases = int(band.get("cases", 0))
    return {"validated_as": key, "cases": cases,
            "mean_abs_error": float(band["mean_abs_error"]) if cases else None,
            "max_abs_error": float(band["max_abs_error"]) if cases else None}


def band_text(validated_as: str, cases: int, mean: float | None, worst: float | None) -> str:
    """One cell: "±4.5% (max 10.3%, 13 compile cases)", or "no band (strict)" where none was measured."""
    if not cases or mean is None or worst is None:
        return f"no band ({validated_as})"
    return f"±{mean:.1%} (max {worst:.1%}, {cases} {validated_as} case{'s' if cases != 1 else ''})"
