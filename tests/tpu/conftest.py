"""Tests that need JAX to see a real accelerator (TPU or GPU): skipped cleanly everywhere else."""

from __future__ import annotations

import pytest

import tpusim.backend  # noqa: F401


def _accelerator() -> str | None:
    try:
        import jax
    except ImportError:
        return None
    platform = jax.devices()[0].platform
    return platform if platform in ("tpu", "gpu") else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _accelerator() is None:
        skip = pytest.mark.skip(reason="JAX sees no TPU or GPU (tests/tpu/ need a real accelerator)")
        for item in items:
            if "tests/tpu/" in str(item.fspath).replace("\\", "/"):
                item.add_marker(skip)
