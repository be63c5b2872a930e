"""The ``Target`` interface: what computes the values of the tpu device's ops.

The fallback (tpusim/backend/dispatch/fallback.py) decides what a call is (host aliases of its tpu tensors, the
generator it draws from, the float64 policy, what to record); the held target decides how its
values are computed. Exactly one target is held, in ``STATE.target``: chosen once at
registration from the device config (``DeviceConfig.target``, TPUSIM_TARGET), or switched by
``pjrt.enable()`` / ``pjrt.disable()``, always through ``use``. Nobody swaps functions in
another module; callers ask the held target.

A target answers four calls:

- ``execute(op, plan, host_args, host_kwargs)``: compute one op on the host aliases of its
  arguments (``plan`` is the fallback's ``OverloadPlan`` of the overload) and return what the overload
  returns, as host tensors; arguments it writes must hold their values in host memory by the time
  anyone reads them (at once, or at the next ``flush``);
- ``flush(reason)``: run pending work now, because code outside ``execute`` is about to read
  device memory (a collective, a compiled graph, a step's clock); ``reason`` names the cut
  (a ``tpusim.eager.windows.CUTS`` key);
- ``on_mode_change(old, new)``: the eager mode changed (tpusim/eager/state.py); the device calls it
  after debug mode applied its own part (tpusim/backend/device/registration.py);
- ``activate()`` / ``deactivate()``: it becomes / stops being the held target (``use``);
  deactivating runs pending work first (cut ``end``).

Adding a target = one module in this folder with a ``Target`` subclass, and its name in
``targets.TARGETS``.
"""

from __future__ import annotations

import torch

from tpusim.backend.dispatch.fallback import OverloadPlan
from tpusim.backend.plumbing.state import STATE


class Target:
    """One way to compute the device's ops (see the module docstring); the defaults do nothing."""

    name = ""

    def execute(self, op: torch._ops.OpOverload, plan: OverloadPlan, host_args: list, host_kwargs: dict) -> object:
        raise NotImplementedError

    def flush(self, reason: str) -> None:
        """Run pending work now (``reason``: why, a ``tpusim.eager.windows.CUTS`` key)."""

    def on_mode_change(self, old: str, new: str) -> None:
        """The eager mode changed from ``old`` to ``new``."""

    def activate(self) -> None:
        """It became the held target."""

    def deactivate(self) -> None:
        """It stops being the held target: pending work runs first."""


def use(target: Target) -> None:
    """Hold ``target`` from now on; the target held before lets go first (its pending work runs).
    Using the held target again restarts it (as ``pjrt.enable()`` twice does)."""
    old = STATE.target
    if old is not None:
        old.deactivate()
    STATE.target = target
    target.activate()
