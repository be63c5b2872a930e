"""``torch_tpu._internal.utils.test_utils``: TorchTPU's test flavour of ``assert_close`` (``check_value=None`` is LOOSE;
passing LOOSE raises ValueError) and ``compute_optimal_tolerances`` (tpusim/backend/torchtpu/checks.py)."""

from typing import Any

from tpusim.backend.torchtpu import checks
from tpusim.backend.torchtpu.checks import CheckValueMode, Tolerance


def assert_close(actual: Any, expected: Any, rtol: float | None = None, atol: Tolerance | None = None,
                 preamble: str | None = None, check_value: CheckValueMode | None = None,
                 check_dtype: bool = True) -> None:
    """``utils.assert_close`` with LOOSE as the unnamed default."""
    checks.assert_close(actual, expected, rtol, atol, preamble, check_value, check_dtype, loose_by_default=True)


def compute_optimal_tolerances(actual: Any, expected: Any, safety_factor: float = checks.SAFETY) -> tuple[float, float]:
    """(atol, rtol): the tightest bounds covering every difference, times ``safety_factor``."""
    return checks.tight_tolerances(actual, expected, safety_factor)


__all__ = ["CheckValueMode", "Tolerance", "assert_close", "compute_optimal_tolerances"]
