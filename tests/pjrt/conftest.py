"""Shared setup of the PJRT/compile tests: skip without jax (the ``pjrt`` extra), import it once."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import tpusim.backend  # noqa: F401  (registers "tpu" before anything imports torch.testing)

pytest.importorskip("jax", reason="the pjrt extra (jax[cpu]) is not installed")
sys.path.insert(0, str(Path(__file__).parent))       # models.py, sweep.py


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture
def pjrt_mode(request: pytest.FixtureRequest) -> object:
    """Enable the PJRT target in the eager mode given by indirect parametrisation (``enable`` sets the
    process's eager mode); back to the sim target and the previous eager mode afterwards."""
    from tpusim.backend.targets import pjrt

    import tpusim

    previous = tpusim.get_eager_mode()
    pjrt.enable(request.param)
    pjrt.reset_stats()
    yield pjrt
    pjrt.disable()
    tpusim.set_eager_mode(previous)
