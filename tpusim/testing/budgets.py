"""Budgets a CI gate checks against a run's report.json: step time, HBM peak, lint codes.

Why one module: ``tpusim check`` and the pytest plugin's ``tpusim_run`` read the same report fields
and accept the same names (``--fail-on f64,host-sync``), so a budget passes or fails identically in
both. Torch-free: it reads report.json's dict only (tpusim/report/model.py writes it).

Adding a lint alias = one row in ``LINT_ALIASES`` (the codes themselves are ``tpusim.report.lint.RULES``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tpusim.errors import TpusimError
from tpusim.units import parse_bytes

if TYPE_CHECKING:
    from tpusim.report.schema import Report

# short names the issue and users write -> the lint code report.json uses. Adding an alias = one row here.
LINT_ALIASES = {"f64": "float64", "fp64": "float64", "complex": "float64", "sync": "host-sync",
                "host-syncs": "host-sync", "padding": "mxu-padding", "hbm-near-capacity": "hbm"}

_SECONDS = {"": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9, "min": 60.0}
_DURATION_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)\s*([a-zµ]*)\s*$")


def lint_codes() -> tuple[str, ...]:
    """Every lint code report.json can hold (tpusim.report.lint.RULES)."""
    from tpusim.report.lint import RULES

    return tuple(RULES)


def lint_code(name: str) -> str:
    """A lint name as a user writes it (a RULES code or an alias, any case) -> the RULES code."""
    text = name.strip().lower()
    code = LINT_ALIASES.get(text, text)
    if code not in lint_codes():
        raise TpusimError(f"unknown lint code {name.strip()!r}; accepted: {', '.join(lint_codes())} "
                          f"(aliases: {', '.join(f'{a}={c}' for a, c in LINT_ALIASES.items())})")
    return code


def parse_lint_list(text: str) -> tuple[str, ...]:
    """``--fail-on f64,host-sync`` (or ``all``) -> RULES codes, in the order given, without repeats."""
    names = [part for part in text.split(",") if part.strip()]
    if not names:
        raise TpusimError("--fail-on needs lint codes, e.g. --fail-on f64,host-sync (or all)")
    if [n.strip().lower() for n in names] == ["all"]:
        return lint_codes()
    return tuple(dict.fromkeys(lint_code(name) for name in names))


def parse_seconds(text: str) -> float:
    """``--max-step-time``: ``12ms``, ``0.5s``, ``250us``, ``1e-3`` (seconds without a unit) -> seconds > 0."""
    found = _DURATION_RE.match(str(text))
    if not found and _DURATION_RE.match(str(text).strip().removeprefix("-")):     # "-5ms": the sign is what is wrong
        raise TpusimError(f"--max-step-time {text!r}: must be a positive duration")
    if not found or found.group(2) not in _SECONDS:
        raise TpusimError(f"--max-step-time {text!r}: give a duration, e.g. 12ms, 0.5s, 250us "
                          f"(units: {', '.join(u for u in _SECONDS if u)}; no unit: seconds)")
    seconds = float(found.group(1)) * _SECONDS[found.group(2)]
    if not math.isfinite(seconds) or seconds <= 0:
        raise TpusimError(f"--max-step-time {text!r}: must be a positive duration")
    return seconds


@dataclass(frozen=True)
class HbmLimit:
    """An HBM peak budget: a share of the chip's capacity (``0.9``, ``90%``) or bytes (``16GiB``)."""

    fraction: float | None = None
    bytes: int | None = None

    def limit_bytes(self, capacity_bytes: int) -> float:
        return self.bytes if self.bytes is not None else (self.fraction or 0.0) * capacity_bytes

    def text(self) -> str:
        from tpusim.units import format_bytes

        return format_bytes(self.bytes) if self.bytes is not None else f"{self.fraction:.0%} of HBM"


def parse_hbm(text: str) -> HbmLimit:
    """``--max-hbm``: a share of the chip's HBM (``0.8`` or ``80%``, at most 1) or a size (``12GiB``)."""
    raw = str(text).strip()
    try:
        if raw.endswith("%"):
            fraction = float(raw[:-1]) / 100
        elif re.fullmatch(r"[0-9]*\.?[0-9]+", raw):
            fraction = float(raw)       # a bare number is a share; a size needs its unit (12GiB)
        else:
            return HbmLimit(bytes=parse_bytes(raw))
    except (ValueError, TpusimError):
        raise TpusimError(f"--max-hbm {text!r}: give a share of the chip's HBM (0.8 or 80%) or a size "
                          f"(12GiB, 16GB)") from None
    if not 0 < fraction <= 1:
        raise TpusimError(f"--max-hbm {text!r}: a share of HBM must be above 0 and at most 1 (100%); "
                          f"give a size with its unit, e.g. 12GiB")
    return HbmLimit(fraction=fraction)


@dataclass(frozen=True)
class Budgets:
    """What a gate asserts; None / empty: not checked."""

    max_step_time_s: float | None = None
    max_hbm: HbmLimit | None = None
    fail_on: tuple[str, ...] = ()


@dataclass(frozen=True)
class Check:
    """One gate result, as a CI system shows it: a name, pass/fail, and a line saying why."""

    name: str
    passed: bool
    message: str


def script_check(report: Report) -> Check:
    """The script itself ran to its end: exit status 0, no exception, not interrupted (report.json's
    ``complete``; ``incomplete_reason`` says why not in the report's own words)."""
    from tpusim.report.model import incomplete_reason

    script = report.run.script
    if report.complete:
        return Check("script", True, f"{script} ran to its end")
    last = ((report.error and report.error.traceback) or "").strip().splitlines()[-1:]
    return Check("script", False, f"{script}: {incomplete_reason(report)}" + (f" ({last[0]})" if last else ""))


def evaluate(report: Report, budgets: Budgets) -> list[Check]:
    """Every budget against every mode the report priced, then each --fail-on lint code."""
    from tpusim.units import format_bytes, format_seconds

    checks = []
    for mode, entry in report.modes.items():
        if budgets.max_step_time_s is not None:
            step = entry.time_s
            ok = step <= budgets.max_step_time_s
            checks.append(Check(f"step-time[{mode}]", ok,
                                f"{entry.timed} {format_seconds(step)} {'<=' if ok else '>'} budget "
                                f"{format_seconds(budgets.max_step_time_s)} ({mode} mode on "
                                f"{report.run.topology} {report.run.chip})"))
        if budgets.max_hbm is not None:
            peak = entry.hbm.peak_bytes
            capacity = entry.hbm.capacity_bytes or report.chip.hbm_bytes or 0
            limit = budgets.max_hbm.limit_bytes(capacity)
            ok = peak <= limit
            share = f" = {100 * peak / capacity:.3g}% of {format_bytes(capacity)}" if capacity else ""
            checks.append(Check(f"hbm[{mode}]", ok, f"HBM peak {format_bytes(peak)}{share} "
                                                    f"{'<=' if ok else '>'} budget {budgets.max_hbm.text()}"))
    for code in budgets.fail_on:
        found = [w for w in report.warnings if w.code == code]
        lines = "; ".join(f"{w.source or '-'}: {w.message}" for w in found[:5])
        checks.append(Check(f"lint[{code}]", not found,
                            f"no {code} findings" if not found else f"{len(found)} {code} finding(s): {lines}"))
    return checks
