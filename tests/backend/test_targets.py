"""The execution target: one ``Target`` held in the device's state computes every op's values; the
fallback, ``flush_pending`` and the eager mode reach it only through ``STATE.target``."""

from __future__ import annotations

import pytest
import torch

import tpusim
from tpusim.backend.plumbing.state import STATE
from tpusim.backend.targets import TARGETS, flush_pending, select
from tpusim.backend.targets.base import Target, use
from tpusim.backend.targets.sim import SIM, run_kernel


class Counting(Target):
    """The sim target's arithmetic, with every call to the interface written down."""

    name = "counting"

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def execute(self, op: torch._ops.OpOverload, plan: object, host_args: list, host_kwargs: dict) -> object:
        self.calls.append(("execute", plan.name))
        return run_kernel(op, plan, host_args, host_kwargs)

    def flush(self, reason: str) -> None:
        self.calls.append(("flush", reason))

    def on_mode_change(self, old: str, new: str) -> None:
        self.calls.append(("mode", old, new))

    def activate(self) -> None:
        self.calls.append(("activate",))

    def deactivate(self) -> None:
        self.calls.append(("deactivate",))


@pytest.fixture
def counting() -> Counting:
    target = Counting()
    use(target)
    yield target
    use(SIM)


def test_the_sim_target_is_held_by_default() -> None:
    assert STATE.target is SIM and select("sim") is SIM and TARGETS == ("sim", "pjrt")
    with pytest.raises(ValueError, match="accepted: sim, pjrt"):
        select("tpu")


def test_every_op_goes_through_the_held_target(counting: Counting) -> None:
    x = torch.arange(4.0, device="tpu")
    y = (x * 2).sum()
    assert y.item() == 12.0
    assert counting.calls[0] == ("activate",)
    assert ("execute", "aten::mul") in counting.calls and ("execute", "aten::sum") in counting.calls


def test_flush_pending_and_mode_changes_ask_the_held_target(counting: Counting) -> None:
    flush_pending("collective")
    previous = tpusim.get_eager_mode()
    with tpusim.eager_mode("fused" if previous != "fused" else "strict") as mode:
        pass
    assert counting.calls[1:] == [("flush", "collective"), ("mode", previous, mode), ("mode", mode, previous)]


def test_using_another_target_lets_the_held_one_go_first(counting: Counting) -> None:
    other = Counting()
    use(other)
    assert counting.calls[-1] == ("deactivate",) and other.calls == [("activate",)]
    use(counting)
