"""One op on the PJRT target: its jitted computation, how it is called and how its results land.

Shared by the target's two parts, so neither reaches into the other: pjrt.py (which builds and
caches the computation of each op signature and runs it at once in debug and strict) and
pjrt_fused.py (which wires the same computations into a fused window, or runs one at once when
the window cannot hold it).

- ``OpInfo``: how an overload runs here (``functional``, ``inplace``, ``out``, ``host``: from
  tpusim/backend/aten/op_schema.py), decided once per overload;
- ``Compiled``: one op signature's jitted computation, with its top-level Python floats lifted to
  arguments (``lift``, ``operands``) so a new value does not recompile it;
- ``run_now``: call it on host memory now, and ``finish``: land its results as the overload
  returns them (fresh tensors, ``self``, or the out= tensors, written back to host memory);
- ``Stats``: what the target did (``pjrt.stats()``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from tpusim.backend.lowering import jax_to_tensor, tensor_to_numpy
from tpusim.eager.windows import WindowCutter


@dataclass
class Stats:
    """What the PJRT target did since the last ``pjrt.reset_stats()``."""

    ops: int = 0                  # ops executed through JAX
    host_ops: int = 0             # ops run on the host (CPU kernel)
    compiles: int = 0             # jitted computations built (per op signature, or per window)
    executions: int = 0           # jitted computations run
    cutter: WindowCutter = field(default_factory=WindowCutter, repr=False, compare=False)
    """Where fused windows end (tpusim/eager/windows.py, fed by pjrt_fused.Window): the windows ended and
    why, counted as tpusim.eager.fusion counts them."""

    @property
    def windows(self) -> int:
        """Fused windows ended (as tpusim.eager.fusion's ``FusionStats.windows``)."""
        return self.cutter.windows

    @property
    def cuts(self) -> dict[str, int]:
        """Why they ended (``tpusim.eager.windows.CUTS`` keys, as ``FusionStats.cuts``)."""
        return dict(self.cutter.cuts)


@dataclass
class OpInfo:
    """How one overload runs here, decided once."""

    kind: str                                     # "functional", "inplace", "out" or "host"
    functional: torch._ops.OpOverload | None = None
    why: str = ""


# ---------------------------------------------------------------- the tensors and floats of a call


def tensors(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensors of (args, kwargs) in pytree order (hand-written: it runs for every op, and aten
    arguments nest only lists and tuples)."""
    found: list[torch.Tensor] = []
    _collect(args, found)
    _collect(tuple(kwargs.values()), found)
    return found


def _collect(v: object, acc: list[torch.Tensor]) -> None:
    if isinstance(v, torch.Tensor):
        acc.append(v)
    elif isinstance(v, (list, tuple)):
        for x in v:
            _collect(x, acc)


class Float:
    """Where a lifted Python float was, in ``lift``'s skeleton."""


def lift(args: tuple, kwargs: dict) -> tuple[tuple, dict, list[float]]:
    """(args, kwargs) with their top-level Python floats replaced by ``Float``, and those floats."""
    floats: list[float] = []

    def one(v: object) -> object:
        if type(v) is float:
            floats.append(v)
            return Float
        return v

    return tuple(one(v) for v in args), {k: one(v) for k, v in kwargs.items()}, floats


class Compiled:
    """One op signature's jitted computation. ``lifted``: its top-level Python floats (an optimizer's
    step size, bias corrections) are arguments, not constants, so a new value does not recompile it;
    call it with ``operands(...)``."""

    __slots__ = ("fn", "lifted", "__weakref__")

    def __init__(self, fn: Callable, lifted: bool) -> None:
        self.fn, self.lifted = fn, lifted

    def __call__(self, *xs: object) -> object:
        return self.fn(*xs)


def operands(fn: Compiled, args: tuple, kwargs: dict) -> list:
    """What ``fn`` is called with: the call's tensors, then its lifted floats (Python floats reach
    jax.jit weakly typed, so they promote like PyTorch's Python scalars)."""
    return tensors(args, kwargs) + (lift(args, kwargs)[2] if fn.lifted else [])


# ---------------------------------------------------------------- running one op and landing its results


def run_now(info: OpInfo, fn: Compiled, args: tuple, kwargs: dict, outs: dict, stats: Stats) -> object:
    """Run one op's computation on the call's host memory now and land its results (``finish``)."""
    result = fn(*[tensor_to_numpy(t) if isinstance(t, torch.Tensor) else t for t in operands(fn, args, kwargs)])
    stats.ops += 1
    stats.executions += 1
    return finish(info, list(args), outs, result)


def write(dst: torch.Tensor, value: torch.Tensor) -> None:
    if dst.shape != value.shape:
        dst.resize_(value.shape)
    dst.copy_(value)


def finish(info: OpInfo, host_args: list, outs: dict, result: object) -> object:
    """Map jax results onto what the overload returns: fresh tensors, self, or the out= tensors."""
    if info.kind == "inplace":
        write(host_args[0], jax_to_tensor(result))
        return host_args[0]
    if isinstance(result, (tuple, list)):
        values = [jax_to_tensor(r) if r is not None and hasattr(r, "shape") else r for r in result]
    else:
        values = jax_to_tensor(result) if hasattr(result, "shape") else result
    if info.kind == "out":
        dsts = list(outs.values())
        vals = values if isinstance(values, list) else [values]
        for d, v in zip(dsts, vals):
            write(d, v)
        return dsts[0] if len(dsts) == 1 else tuple(dsts)
    return tuple(values) if isinstance(values, list) else values
