"""Shared setup of the PJRT/compile tests: skip without jax (the ``pjrt`` extra), import it once."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import tpusim.backend  # noqa: F401  (registers "tpu" before anything imports torch.testing)

pytest.importorskip("jax", reason="the pjrt extra (jax[cpu]) is not installed")
sys.path.insert(0, str(Path(__file__).parent))       # models.py, sweep.py


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def _pjrt_enabled(mode: str) -> Iterator[object]:
    """The PJRT target in eager ``mode`` (``enable`` sets the process's eager mode), its stats reset; back to
    the sim target and the previous eager mode afterwards."""
    import tpusim
    from tpusim.backend.targets import pjrt

    previous = tpusim.get_eager_mode()
    pjrt.enable(mode)
    pjrt.reset_stats()
    yield pjrt
    pjrt.disable()
    tpusim.set_eager_mode(previous)


@pytest.fixture
def pjrt_mode(request: pytest.FixtureRequest) -> Iterator[object]:
    """The PJRT target in the eager mode given by indirect parametrisation."""
    yield from _pjrt_enabled(request.param)


@pytest.fixture
def fused() -> Iterator[object]:
    """The PJRT target in Fused eager."""
    yield from _pjrt_enabled("fused")
