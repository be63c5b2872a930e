"""The ATen -> JAX lowering table: one decorator, one dict.

A lowering takes the op's arguments as the ATen schema orders them, with every tensor replaced
by a ``jax.Array`` (scalars, dtypes, lists stay Python), and returns jax arrays shaped like the
op's returns. It must be traceable by ``jax.jit`` unless registered with ``jit=False`` (ops whose
output shape depends on values, like ``nonzero``). Adding an op = one ``@register`` on one
function in the module of its family (elementwise, reductions, matmul, shape, indexing, nn,
creation); an ``OpOverloadPacket`` registers every overload the function's signature accepts.
What an overload writes and its functional counterpart come from tpusim/backend/aten/op_schema.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from tpusim.backend.aten.op_schema import facts, functional_of

OpKey = torch._ops.OpOverload | torch._ops.OpOverloadPacket


@dataclass(frozen=True)
class Lowering:
    """One table entry: the function, and whether jax.jit can trace it (static output shapes)."""

    fn: Callable
    jit: bool = True


LOWERINGS: dict[OpKey, Lowering] = {}


def register(*ops: OpKey, jit: bool = True) -> Callable[[Callable], Callable]:
    """Register ``fn`` as the lowering of ``ops`` (overloads, or packets for all their overloads)."""

    def deco(fn: Callable) -> Callable:
        for op in ops:
            LOWERINGS[op] = Lowering(fn, jit)
        return fn

    return deco


def lookup(op: OpKey) -> Lowering | None:
    """The lowering of an overload: its own entry, else its packet's."""
    entry = LOWERINGS.get(op)
    if entry is None and isinstance(op, torch._ops.OpOverload):
        entry = LOWERINGS.get(op.overloadpacket)
    return entry


def inplace_target(op: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """For an in-place overload that writes only ``self`` (``mul_``, ``copy_``), its functional overload."""
    return functional_of(op) if facts(op).writes_self_only else None


def covered(op: torch._ops.OpOverload) -> bool:
    if lookup(op) is not None:
        return True
    functional = inplace_target(op)
    return functional is not None and lookup(functional) is not None
