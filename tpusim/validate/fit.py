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
SERVING_SCRIPT = "validation/decode.py"     # the serving cases' script (tpusim/validate/inference.py): priced, never
#                                             fitted on by leave_one_family_out (HBM-bound, not MXU-bound)


@dataclass(frozen=True)
class Fit:
    parameter: str
    chip: str
    value: float
    cases: tuple[str, ...]
    errors: tuple[float, ...]      # each case's relative error at the fitted value


def valued(calibration: Calibration, parameter: str, value: float) -> Calibration:
    """``calibration`` with ``parameter`` at ``value``, added when the file does not have it yet."""
    if parameter not in calibration.parameters:
        calibration = Calibration(calibration.chip, {**calibration.parameters, parameter: Parameter(
            parameter, value, estimate="a value being fitted")}, calibration.path)
    return calibration.with_value(parameter, value)


def mean_log_error(cases: list[Case], calibration: Calibration) -> tuple[float, tuple[float, ...]]:
    errors = []
    for case in cases:
        errors.append(case.predict(chip_for(case, calibration)).seconds / case.published_s - 1.0)
    return sum(math.log1p(e) for e in errors) / len(errors), tuple(errors)


def fit(parameter: str, cases: list[Case], lo: float = 0.05, hi: float = 1.0,
        base: Calibration | None = None) -> Fit:
    """The value of ``parameter`` (a share, in [lo, hi]) that zeroes the mean log error of ``cases``."""
    if parameter not in PARAMETERS or not PARAMETERS[parameter].share:
        shares = [name for name, kind in PARAMETERS.items() if kind.share]
        raise TpusimError(f"--fit takes a share parameter: {', '.join(shares)}")
    chips = {case.chip for case in cases}
    if len(chips) != 1:
        raise TpusimError(f"fit cases of one chip generation, not {', '.join(sorted(chips))}")
    chip = chips.pop()
    base = valued(base or load_calibration(chip) or Calibration(chip=chip), parameter, 1.0)

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


@dataclass(frozen=True)
class FamilyOut:
    """One model family's product-path cases priced with every chip's ``parameter`` fitted without them."""

    family: str
    errors: dict[str, float]         # case name -> relative error
    values: dict[str, float]         # chip -> the value it was priced with
    how: dict[str, str]              # chip -> which cases that value was fitted on (or "other chips")


def leave_one_family_out(cases: list[Case], parameter: str = "mxu_efficiency") -> list[FamilyOut]:
    """Each model family left out in turn: its chips' ``parameter`` refitted on that chip's fit cases of other
    families (its other training cases when every fit case was of the family; the geometric mean of the other
    chips' calibrated values when the chip has no other case: the chip left out too), then the family's
    cases priced. Serving cases are priced as a family but never fitted on: a decode step is bound by HBM. A
    sibling of a fit case (another slice of the same model) is then never its own check."""
    product = [c for c in cases if c.kind == "measured" and c.path == "product"]
    training = [c for c in product if c.script != SERVING_SCRIPT]    # a decode step barely moves with an MXU share
    families = sorted({c.family or c.name for c in product})
    calibrations = {c.chip: load_calibration(c.chip) or Calibration(chip=c.chip) for c in product}
    out = []
    for family in families:
        inside = [c for c in product if (c.family or c.name) == family]
        values, how, errors = {}, {}, {}
        for chip in sorted({c.chip for c in inside}):
            calib = calibrations[chip]
            fitted = {name for p in calib.parameters.values() for name in p.fitted_on}
            others = [c for c in training if c.chip == chip and (c.family or c.name) != family]
            train = [c for c in others if {c.name, c.twin} & fitted] or others
            if train:
                value = fit(parameter, train, base=calib).value
                how[chip] = ", ".join(c.name for c in train)
            else:
                shares = [cal.parameters[parameter].value for name, cal in calibrations.items()
                          if name != chip and parameter in cal.parameters]
                value = math.exp(sum(map(math.log, shares)) / len(shares)) if shares else 1.0
                how[chip] = "other chips (geometric mean)"
            values[chip] = value
            priced = valued(calib, parameter, value)
            for case in (c for c in inside if c.chip == chip):
                errors[case.name] = case.predict(chip_for(case, priced)).seconds / case.published_s - 1.0
        out.append(FamilyOut(family, errors, values, how))
    return out
