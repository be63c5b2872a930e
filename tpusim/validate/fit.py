"""Fit one calibration parameter of one chip to a set of cases (how the ``fitted_on`` values were made).

``fit(parameter, cases)`` finds the value at which the mean log error of ``cases`` is zero (their
geometric-mean prediction equals the published figures), with every other parameter as the chip's
calibration file has it. The predicted time is monotone in each parameter that is a share of a
datasheet figure, so bisection finds it; ``tpusim validate --fit mxu_efficiency --on CASE,CASE``
runs it and prints the value to write into ``topologies/calibration/<chip>.toml``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tpusim.errors import TpusimError
from tpusim.hardware.calibration import PARAMETERS, Calibration, Parameter, load_calibration
from tpusim.validate.case import Case
from tpusim.validate.suite import chip_for

TOLERANCE = 1e-4             # on the fitted value


@dataclass(frozen=True)
class Fit:
    parameter: str
    chip: str
    value: float
    cases: tuple[str, ...]
    errors: tuple[float, ...]      # each case's relative error at the fitted value


def mean_log_error(cases: list[Case], calibration: Calibration) -> tuple[float, tuple[float, ...]]:
    errors = []
    for case in cases:
        errors.append(case.predict(chip_for(case, calibration)).seconds / case.published_s - 1.0)
    return sum(math.log1p(e) for e in errors) / len(errors), tuple(errors)


def fit(parameter: str, cases: list[Case], lo: float = 0.05, hi: float = 1.0) -> Fit:
    """The value of ``parameter`` (a share, in [lo, hi]) that zeroes the mean log error of ``cases``."""
    if parameter not in PARAMETERS or not PARAMETERS[parameter].share:
        shares = [name for name, kind in PARAMETERS.items() if kind.share]
        raise TpusimError(f"--fit takes a share parameter: {', '.join(shares)}")
    chips = {case.chip for case in cases}
    if len(chips) != 1:
        raise TpusimError(f"fit cases of one chip generation, not {', '.join(sorted(chips))}")
    chip = chips.pop()
    base = load_calibration(chip) or Calibration(chip=chip)
    if parameter not in base.parameters:
        base = Calibration(chip, {**base.parameters, parameter: Parameter(parameter, 1.0, estimate="fitting")},
                           base.path)

    def signed(value: float) -> float:
        return mean_log_error(cases, base.with_value(parameter, value))[0]

    # a larger share means faster: the error falls as the value rises
    if signed(hi) > 0:
        raise TpusimError(f"even {parameter} = {hi:g} predicts slower than published on these cases")
    if signed(lo) < 0:
        raise TpusimError(f"even {parameter} = {lo:g} predicts faster than published on these cases")
    while hi - lo > TOLERANCE:
        mid = (lo + hi) / 2
        if signed(mid) > 0:
            lo = mid
        else:
            hi = mid
    value = round((lo + hi) / 2, 4)
    _, errors = mean_log_error(cases, base.with_value(parameter, value))
    return Fit(parameter, chip, value, tuple(c.name for c in cases), errors)
