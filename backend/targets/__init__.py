"""Execution targets of the tpu device: ``sim`` (the default: CPU kernels on host memory, in
backend/fallback.py) and ``pjrt`` (pjrt.py: ops run through the ATen -> JAX lowering table)."""

from __future__ import annotations

import sys


def flush_pending(reason: str) -> None:
    """Run the PJRT target's pending fused work before code that reads device memory outside the
    executor (collectives, compiled graphs); ``reason`` names the cut. One dict lookup when the
    target was never loaded, so the sim target pays nothing."""
    pjrt = sys.modules.get(f"{__name__}.pjrt")
    if pjrt is not None:
        pjrt.flush(reason)
