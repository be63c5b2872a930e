"""How the report prints its numbers: values below the simulator's resolution read 0, small shares keep
their digits.

Why: the simulator adds and subtracts float seconds, so a quantity that is zero by construction (the
contention of a collective alone on an idle network: DES time minus closed form) comes out as 1e-19 s
and printed as ``1.559e-10 ns``; a share of 0.004% printed with one decimal reads ``0.0%``, and a ratio
of two such zeros looked meaningful. Every printed time goes through ``seconds_text`` and every share
through ``percent_text``, in the terminal, the HTML and ``tpusim compare``.
"""

from __future__ import annotations

from tpusim.units import format_seconds

RESOLUTION_S = 1e-12        # the DES resolves picoseconds at best: below that a time is float rounding
RELATIVE_RESOLUTION = 1e-9  # a difference under this fraction of what it was computed from is rounding
SHARE_RESOLUTION = 1e-6     # a utilisation under 0.0001% (a toy program on a chip of hundreds of TFLOP/s) reads 0
RATE_RESOLUTION = 1e-6      # TFLOP/s: under one MFLOP/s per chip reads 0

# The utilisation labels, one meaning each, on every surface (summary, report.html, compare, sweep, check, the
# pytest plugin): report.json's ``hfu``, headline ``model_flops_utilisation`` and ``mxu_utilisation``.
HFU_LABEL = "HFU (every FLOP run)"
MFU_LABEL = "MFU (6 x params x tokens)"
MXU_LABEL = "MXU utilisation (matmuls)"   # over the time matmul kernels ran, not the step


def resolved(value: float, scale: float = 0.0) -> float:
    """``value``, or 0.0 when it is below the resolution (absolute, or relative to ``scale``)."""
    return 0.0 if abs(value) < max(RESOLUTION_S, RELATIVE_RESOLUTION * abs(scale)) else value


def seconds_text(value: float | None) -> str:
    """A duration for people: '-' when there is none, '0' below the resolution, else s/ms/us/ns."""
    if value is None:
        return "-"
    return "0" if resolved(value) == 0.0 else format_seconds(value)


def percent_text(share: float | None) -> str:
    """A share as a percentage: one decimal from 0.1% up, two significant digits below (0.0042%), 0 under
    ``SHARE_RESOLUTION`` (an MFU of 4e-11% is no number anyone acts on)."""
    if share is None:
        return "-"
    if abs(share) < SHARE_RESOLUTION:
        return "0%"
    if abs(share) >= 1e-3:
        return f"{share:.1%}"
    return f"{share * 100:.2g}%"


def tflops_text(value: float) -> str:
    """A rate in TFLOP/s, three significant digits; 0 under ``RATE_RESOLUTION``."""
    return "0" if abs(value) < RATE_RESOLUTION else f"{value:.3g}"


def ratio_text(a: float | None, b: float | None) -> str:
    """b / a as '2.5x'; '-' when either side is missing or below what can be told apart from 0."""
    if a is None or b is None or resolved(a) == 0.0 or resolved(b) == 0.0:
        return "-"
    return f"{b / a:.3g}x"


def slice_text(topology: str, slices: int | None) -> str:
    """A report's slice in words: '2d:4x4', or '2d:4x4 x 2 slices' for a multislice run."""
    return topology + (f" x {slices} slices" if slices and slices > 1 else "")
