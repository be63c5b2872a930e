"""Shared helpers for the tpu device tests.

Importing tpusim.backend here registers the device before any test module imports
torch.testing (OpInfo's device list is fixed at that import).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import tpusim.backend  # noqa: F401  (registers "tpu")


def run_python(code: str, env: dict[str, str] | None = None, timeout: int = 240) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (settings read at import need a new process)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=full_env, timeout=timeout)


@pytest.fixture
def python() -> object:
    return run_python


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
