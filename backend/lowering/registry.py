"""The ATen -> JAX lowering table: one decorator, one dict.

A lowering takes the op's arguments as the ATen schema orders them, with every tensor replaced
by a ``jax.Array`` (scalars, dtypes, lists stay Python), and returns jax arrays shaped like the
op's returns. It must be traceable by ``jax.jit`` unless registered with ``jit=False`` (ops whose
output shape depends on values, like ``nonzero``). Adding an op = one ``@register`` on one
function in the module of its family (elementwise, reductions, matmul, shape, indexing, nn,
creation); an ``OpOverloadPacket`` registers every overload the function's signature accepts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

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


def functional_of(op: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """The functional overload computing what an in-place (``add_``) or out= (``add.out``) overload writes."""
    schema = op._schema
    name = schema.name.removeprefix("aten::")
    if name.endswith("_") and not name.endswith("__"):
        packet = getattr(torch.ops.aten, name[:-1], None)
        if packet is None:
            return None
        same = getattr(packet, op._overloadname, None)
        if same is not None:
            return same
        names = [a.name for a in schema.arguments]
        return next((getattr(packet, ov) for ov in packet.overloads()
                     if [a.name for a in getattr(packet, ov)._schema.arguments] == names), None)
    want = [a.name for a in schema.arguments if not (a.kwarg_only and a.alias_info is not None
                                                        and a.alias_info.is_write)]
    packet = op.overloadpacket
    for ov in packet.overloads():
        cand = getattr(packet, ov)
        args = cand._schema.arguments
        if cand is not op and not any(a.alias_info is not None and a.alias_info.is_write for a in args) \
                and [a.name for a in args] == want:
            return cand
    return None


def inplace_target(op: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """For an in-place overload that writes only ``self`` (``mul_``, ``copy_``), its functional overload."""
    args = op._schema.arguments
    writes = [a for a in args if a.alias_info is not None and a.alias_info.is_write]
    if len(writes) == 1 and writes[0] is args[0] and not writes[0].kwarg_only and str(writes[0].type) == "Tensor":
        return functional_of(op)
    return None


def covered(op: torch._ops.OpOverload) -> bool:
    if lookup(op) is not None:
        return True
    functional = inplace_target(op)
    return functional is not None and lookup(functional) is not None
