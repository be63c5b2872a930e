"""Run fidelity cases: predicted vs published, errors, held-out statistics, explanations.

``run_cases(cases, calibration=True)`` prices each case on its chip with that generation's
calibration (``tpusim.hardware.calibration``; ``False`` = the datasheet chip) and returns one ``Result`` per
case. A case is *held out* when no parameter of its chip's calibration lists it in ``fitted_on``;
``summarise`` reports the error over measured cases, over the held-out ones among them, and over
the analytic formula checks, separately. ``explain`` says where a case's predicted time goes and how
much each calibrated parameter moves it (+10% each).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from tpusim.errors import TpusimError
from tpusim.hardware.calibration import Calibration, calibrated, calibration_dir, load_calibration
from tpusim.hardware.spec import ChipSpec, available_chips, load_chip
from tpusim.validate.case import Case, Prediction

SENSITIVITY_STEP = 0.10      # each calibrated parameter is perturbed by +10% for --explain


def resolve_chip(name: str) -> ChipSpec:
    """A chip generation by name: ``topologies/chips/<name>.toml``, else a validation-only chip file
    (``topologies/calibration/extra_chips/<name>.toml``, e.g. TPU v2)."""
    if name in available_chips():
        return load_chip(name)
    extra = calibration_dir() / "extra_chips" / f"{name}.toml"
    if extra.is_file():
        return load_chip(extra)
    raise TpusimError(f"case chip {name!r} has no chip file in topologies/chips/ or {extra.parent}")


def chip_for(case: Case, calibration: bool | Calibration | None = True) -> ChipSpec:
    return calibrated(resolve_chip(case.chip), calibration)


@dataclass(frozen=True)
class Result:
    """One case priced: published and predicted seconds, the signed relative error, and whether the
    case was held out from its chip's calibration."""

    case: Case
    predicted_s: float
    prediction: Prediction
    calibrated: bool              # a calibration was applied to the case's chip
    held_out: bool                # no calibrated parameter was fitted on this case
    fitted_on: tuple[str, ...] = ()   # the calibrated parameters fitted on this case

    @property
    def error(self) -> float:
        """(predicted - published) / published."""
        return self.predicted_s / self.case.published_s - 1.0

    def to_dict(self) -> dict:
        c = self.case
        return {"name": c.name, "chips": case_chips(c), "mode": c.mode or "fused", "compiler": c.compiler or None,
                "script": c.script or None,
                "path": c.path, "family": c.family or c.name, "published_s": c.published_s,
                "predicted_s": self.predicted_s, "error": self.error, "held_out": self.held_out,
                "fitted_on": list(self.fitted_on),
                "case": c.name, "title": c.title, "kind": c.kind, "chip": c.chip, "slice": c.slice,
                "setup": c.setup, "published": c.published, "conversion": c.conversion, "source": c.source,
                "where": c.where, "twin": c.twin or None, "calibrated": self.calibrated, "slow": c.slow,
                "breakdown_s": dict(self.prediction.parts), "notes": list(self.prediction.notes)}


@dataclass(frozen=True)
class Summary:
    """Mean and max |error| of a set of results (None when the set is empty)."""

    label: str
    count: int
    mean_abs: float | None
    max_abs: float | None
    worst: str = ""

    def to_dict(self) -> dict:
        return {"count": self.count, "mean_abs_error": self.mean_abs, "max_abs_error": self.max_abs,
                "worst": self.worst}


def run_case(case: Case, calibration: bool = True) -> Result:
    """Price one case (``calibration``: apply its chip's calibration file, if there is one)."""
    calib = load_calibration(case.chip) if calibration else None
    chip = chip_for(case, calib)
    prediction = case.predict(chip)
    names = {case.name, case.twin} - {""}
    fitted = tuple(name for name, p in (calib.parameters.items() if calib else ()) if names & set(p.fitted_on))
    return Result(case, prediction.seconds, prediction, calibrated=calib is not None, held_out=not fitted,
                  fitted_on=fitted)


def run_cases(cases, calibration: bool = True, progress=None) -> list[Result]:
    results = []
    for case in cases:
        if progress:
            progress(case)
        results.append(run_case(case, calibration))
    return results


def case_chips(case: Case) -> int | None:
    """How many chips a product-path case's slice has (None for the closed-form cases' descriptive slices)."""
    from tpusim.slice.topology import parse_topology

    if case.path != "product":
        return None
    return math.prod(parse_topology(case.slice.split(" ")[0])) * case.slices


def summarise(results: list[Result]) -> dict[str, Summary]:
    """Error statistics: the product-path cases (held out, and the fit cases), the closed-form cross-check
    cases, every measured case, and the analytic formula checks, each apart."""
    measured = [r for r in results if r.case.kind == "measured"]
    product = [r for r in measured if r.case.path == "product"]
    groups = {
        "product_held_out": [r for r in product if r.held_out],
        "product_fitted": [r for r in product if not r.held_out],
        "closed_form": [r for r in measured if r.case.path == "closed-form"],
        "measured": measured,
        "held_out": [r for r in measured if r.held_out],
        "fitted": [r for r in measured if not r.held_out],
        "analytic": [r for r in results if r.case.kind == "analytic"],
    }
    return {label: summary_of(label, rs) for label, rs in groups.items()}


def summary_of(label: str, results: list[Result]) -> Summary:
    """Mean and max |error| of ``results``, and the worst case's name (count 0 and None when empty)."""
    if not results:
        return Summary(label, 0, None, None)
    worst = max(results, key=lambda r: abs(r.error))
    return Summary(label, len(results), statistics.fmean(abs(r.error) for r in results), abs(worst.error),
                   worst.case.name)


@dataclass(frozen=True)
class Sensitivity:
    parameter: str
    value: float
    perturbed: float
    predicted_s: float
    change: float                 # relative change of the prediction
    basis: str


@dataclass(frozen=True)
class Explanation:
    result: Result
    calibration: Calibration | None
    sensitivities: tuple[Sensitivity, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict:
        return {**self.result.to_dict(),
                "calibration": self.calibration.to_dict() if self.calibration else None,
                "sensitivity": [{"parameter": s.parameter, "value": s.value, "perturbed": s.perturbed,
                                 "predicted_s": s.predicted_s, "change": s.change, "basis": s.basis}
                                for s in self.sensitivities]}


def explain(case: Case, calibration: bool = True) -> Explanation:
    """Where ``case``'s predicted time goes, and the prediction's change when each calibrated parameter
    of its chip is raised by ``SENSITIVITY_STEP``."""
    result = run_case(case, calibration)
    calib = load_calibration(case.chip) if calibration else None
    sens = []
    for name, param in (calib.parameters.items() if calib else ()):
        perturbed = param.value * (1 + SENSITIVITY_STEP)
        chip = chip_for(case, calib.with_value(name, perturbed))
        seconds = case.predict(chip).seconds
        sens.append(Sensitivity(name, param.value, perturbed, seconds, seconds / result.predicted_s - 1.0,
                                param.describe()))
    return Explanation(result, calib, tuple(sens))


def find_case(cases, name: str) -> Case:
    for case in cases:
        if case.name == name:
            return case
    matches = [c for c in cases if name in c.name]
    if len(matches) == 1:
        return matches[0]
    hint = f"; did you mean one of: {', '.join(c.name for c in matches)}" if matches else ""
    raise TpusimError(f"unknown case {name!r}{hint} (`tpusim validate --list` names them all)")


def calibration_files() -> list[Path]:
    return sorted(calibration_dir().glob("*.toml"))
