"""The simulator target (the default): every op computed at once by its CPU kernel on host memory.

The device's memory is host memory (the shim's allocator), so an op's host aliases are its
tensors: the CPU kernel, or the hand-written kernel of tpusim/backend/aten/handwritten_kernels.py where the CPU one is
wrong for the device, computes the values in place of a TPU. Nothing is ever pending, so
``flush`` has nothing to do, and the eager mode changes only what the simulator prices
(tpusim/eager/modes.py), never the numbers. ``run_kernel`` is also how the PJRT target runs the ops
it keeps on the host. With --numerics tpu (tpusim/backend/dispatch/tpu_numerics.py) the contracting ops' kernels run
at the TPU's precision instead.

While it is held outside debug eager mode, the shim's fallback runs the common op itself, in C++
(tpusim/backend/csrc/fallback.cpp): the same CPU kernel on the same aliases, without the Python call
(``set_fast``); debug mode's per-op checks and every other target go through the Python fallback.
"""

from __future__ import annotations

import torch

from tpusim.backend.dispatch import tpu_numerics
from tpusim.backend.dispatch.fallback import OverloadPlan
from tpusim.backend.plumbing.state import STATE
from tpusim.backend.targets.base import Target
from tpusim.eager import state as eager


def run_kernel(op: torch._ops.OpOverload, plan: OverloadPlan, host_args: list, host_kwargs: dict) -> object:
    """The hand-written kernel (tpusim/backend/aten/handwritten_kernels.py) or the CPU kernel of ``op``, on the host
    aliases."""
    if plan.kernel is not None:
        return plan.kernel(op, host_args, host_kwargs)
    return op._op(*host_args, **host_kwargs)


class SimTarget(Target):
    name = "sim"

    def execute(self, op: torch._ops.OpOverload, plan: OverloadPlan, host_args: list, host_kwargs: dict) -> object:
        if tpu_numerics.applies(plan.name):              # --numerics tpu: a contraction as a TPU computes it
            return tpu_numerics.execute(op, plan, host_args, host_kwargs, run_kernel)
        return run_kernel(op, plan, host_args, host_kwargs)

    def activate(self) -> None:
        STATE.shim.set_fast(eager.get_eager_mode() != "debug")

    def deactivate(self) -> None:
        STATE.shim.set_fast(False)

    def on_mode_change(self, old: str, new: str) -> None:
        STATE.shim.set_fast(new != "debug")


SIM = SimTarget()
