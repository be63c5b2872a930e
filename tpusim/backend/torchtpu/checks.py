"""torch_tpu's tensor comparison (``_internal.utils.utils.assert_close`` and ``_internal.utils.test_utils``'s).

    utils.assert_close(actual=tpu_weight, expected=cpu_weight, rtol=1e-4, atol=7e-2,
                       check_value=utils.CheckValueMode.LOOSE, preamble="step 3")

As TorchTPU documents it: tensors, or sequences of them (compared pairwise), or two Nones; shapes and dtypes
must match (``check_dtype=False`` promotes both first); values compare by ``check_value``:

- ``LOOSE``: PyTorch's rule, |actual - expected| <= atol + rtol * |expected| (NaNs equal, devices ignored);
  a tolerance left out takes torch.testing's default for the dtype;
- ``STRICT``: both bounds alone: |a - e| <= atol and |a - e| <= rtol * |e| (with 1e-7 of slack, 0 for float8);
- ``SKIP``: shapes and dtypes only;
- ``atol`` a function of the expected value (then rtol must be None): |a - e| <= atol(e) per element.

A failure is an AssertionError naming the worst elements and the tightest tolerances that would pass
(``tight_tolerances``: atol from elements with |e| <= 1, rtol from the rest, times 1.2). test_utils' flavour
(``assert_close(..., loose_by_default=True)``) takes ``check_value=None`` for LOOSE and refuses an explicit LOOSE.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

Tolerance = float | Callable[[float], float]
SAFETY = 1.2


class CheckValueMode(enum.Enum):
    """How values are compared (TorchTPU's members and values)."""

    SKIP = "skip"
    LOOSE = "loose"
    STRICT = "strict"


def assert_close(actual: Any, expected: Any, rtol: float | None = None, atol: Tolerance | None = None,
                 preamble: str | None = None, check_value: CheckValueMode | None = CheckValueMode.LOOSE,
                 check_dtype: bool = True, *, loose_by_default: bool = False) -> None:
    """Raise AssertionError unless ``actual`` is close to ``expected`` (see the module docstring)."""
    if loose_by_default and check_value == CheckValueMode.LOOSE:
        raise ValueError("LOOSE mode is the default. Please omit the check_value argument.")
    mode = CheckValueMode.LOOSE if check_value is None else check_value
    if actual is None or expected is None:
        assert actual is None and expected is None, f"both must be None or neither: {actual=} {expected=}"
        return
    if not check_dtype and isinstance(actual, torch.Tensor) and isinstance(expected, torch.Tensor):
        common = torch.promote_types(actual.dtype, expected.dtype)
        actual, expected = actual.to(common), expected.to(common)
    seqs = [isinstance(v, Sequence) and not isinstance(v, str) for v in (actual, expected)]
    assert seqs[0] == seqs[1], f"one value is a sequence and the other is not:\n{actual=}\n{expected=}"
    if seqs[0]:
        assert len(actual) == len(expected), f"{len(actual)} actual values against {len(expected)} expected"
        for a, e in zip(actual, expected):
            assert_close(a, e, rtol, atol, preamble, check_value, check_dtype, loose_by_default=loose_by_default)
        return
    assert isinstance(actual, torch.Tensor) and isinstance(expected, torch.Tensor), \
        f"values to compare must be tensors, got {type(actual).__name__} and {type(expected).__name__}"
    _tensor_close(actual, expected, rtol, atol, (preamble.rstrip() + "\n") if preamble else "", mode)


def _tensor_close(actual: torch.Tensor, expected: torch.Tensor, rtol: float | None, atol: Tolerance | None,
                  preamble: str, mode: CheckValueMode) -> None:
    for what in ("shape", "dtype"):
        if getattr(actual, what) != getattr(expected, what):
            raise AssertionError(f"{preamble}Tensor {what} mismatch: expected {getattr(expected, what)}, "
                                 f"actual {getattr(actual, what)}\nExpected tensor:\n{expected}\n\n"
                                 f"Actual tensor:\n{actual}")
    if mode == CheckValueMode.SKIP:
        return
    actual, expected = actual.detach().cpu(), expected.detach().cpu()
    if callable(atol):
        assert rtol is None, f"rtol must be None when atol is a function, got {rtol=}"
        _per_element(actual, expected, atol, preamble)
        return
    default_rtol, default_atol = torch.testing._comparison.default_tolerances(actual, expected)
    rtol = default_rtol if rtol is None else rtol
    atol = default_atol if atol is None else atol
    if mode == CheckValueMode.LOOSE:
        _compare(actual, expected, rtol, atol, preamble, mode)
    else:
        _compare(actual, expected, 0.0, atol, preamble, mode)
        slack = 0.0 if actual.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else 1e-7
        _compare(actual, expected, rtol, slack, preamble, mode)


def _compare(actual: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float, preamble: str,
             mode: CheckValueMode) -> None:
    def message(text: str) -> str:
        return f"{preamble}{text}\n{_suggestion(actual, expected, mode)}\nExpected tensor:\n{expected}\n\n" \
               f"Actual tensor:\n{actual}"

    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True, check_device=False,
                               msg=message)


def _per_element(actual: torch.Tensor, expected: torch.Tensor, atol: Callable[[float], float], preamble: str) -> None:
    bad = []
    for index, (a, e) in enumerate(zip(actual.flatten().tolist(), expected.flatten().tolist())):
        if not (math.isnan(a) and math.isnan(e)) and not abs(a - e) <= atol(e):
            where = tuple(int(i) for i in torch.unravel_index(torch.tensor(index), expected.shape))
            bad.append(f"at index {where}, expected={e}, actual={a}, diff={abs(a - e)}, tolerance={atol(e)}")
    if bad:
        raise AssertionError(f"{preamble}Values are not close at {len(bad)} indices:\n" + "\n".join(bad))


def tight_tolerances(actual: Any, expected: Any, safety: float = SAFETY) -> tuple[float, float]:
    """The smallest (atol, rtol) pair covering every difference, one bound per element: elements with
    |expected| <= 1 set atol, the others rtol; times ``safety``, rounded up. NaN where NaNs do not pair."""
    if isinstance(actual, list | tuple):
        pairs = [tight_tolerances(a, e, safety) for a, e in zip(actual, expected, strict=True)]
        return max((p[0] for p in pairs), default=0.0), max((p[1] for p in pairs), default=0.0)
    a = torch.as_tensor(actual).detach().cpu()
    e = torch.as_tensor(expected).detach().cpu()
    wide = torch.complex128 if a.dtype.is_complex else torch.float64
    a, e = a.to(wide), e.to(wide)
    if (torch.isnan(a) ^ torch.isnan(e)).any():
        return math.nan, math.nan
    keep = ~torch.isnan(a)
    diff, size = (a[keep] - e[keep]).abs(), e[keep].abs()
    small = size <= 1
    atol = float(diff[small].max()) if small.any() else 0.0
    rtol = float((diff[~small] / size[~small]).max()) if (~small).any() else 0.0
    return tuple(math.nextafter(safety * v, math.inf) if math.isfinite(v) and v else v for v in (atol, rtol))


def _suggestion(actual: torch.Tensor, expected: torch.Tensor, mode: CheckValueMode) -> str:
    atol, rtol = tight_tolerances(actual, expected)
    if math.isnan(atol) or math.isnan(rtol):
        return f"Tolerance suggestions ({mode.name}): none (NaNs at different places)"
    return f"Tolerance suggestions ({mode.name}): rtol >= {rtol:.3g}, atol >= {atol:.3g} (1.2x the tightest)"


__all__ = ["CheckValueMode", "Tolerance", "assert_close", "tight_tolerances"]
