"""Execution targets of the tpu device: what computes the values of its ops.

- ``sim`` (sim.py, the default): the CPU kernel on host memory, at once;
- ``pjrt`` (pjrt.py): through the ATen -> JAX lowering table on JAX's default device, one jitted
  computation per op (debug, strict) or fusion's windows as one program each (pjrt_fused.py);
  pjrt_ops.py holds what both of its parts share (one op's computation, how results land).

base.py has the ``Target`` interface and ``use``, which makes a target the held one
(``STATE.target``); ``select`` names one. ../device/measure_worker.py is the measured side
of ``tpusim run --target pjrt``.
"""

from __future__ import annotations

from tpusim.backend.plumbing.config import TARGETS
from tpusim.backend.plumbing.state import STATE
from tpusim.backend.targets.base import Target
from tpusim.backend.targets.sim import SIM

__all__ = ["TARGETS", "Target", "flush_pending", "select"]


def select(name: str) -> Target:
    """The target called ``name`` (one of ``config.TARGETS``: ``DeviceConfig.target``, TPUSIM_TARGET)."""
    if name == "pjrt":
        # Function-level: the PJRT target imports jax (an optional, heavy dependency), only when chosen.
        from tpusim.backend.targets import pjrt

        return pjrt.PJRT
    if name == "sim":
        return SIM
    raise ValueError(f"unknown target {name!r}; accepted: {', '.join(TARGETS)}")


def flush_pending(reason: str) -> None:
    """Run the held target's pending work before code that reads device memory outside ``execute``
    (collectives, compiled graphs); ``reason`` names the cut. The sim target has none."""
    target = STATE.target
    if target is not None:
        target.flush(reason)
