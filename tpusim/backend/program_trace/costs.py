"""An op's cost from torch tensors: the tensors and arguments turned into the metadata the cost rules read,
then the shared rule (torch-free, one row per op in tpusim/trace/ops.py's ``OPS``, formulas in
tpusim/trace/cost_rules.py).

The backend keeps only what needs torch: the conversion. ``OpCost``, ``counted_cost`` and ``reads_arguments``
are the shared ones, re-exported for the recorder, the shim and the targets.
"""

from __future__ import annotations

import torch

from tpusim.trace import ops
from tpusim.trace.cost_rules import Meta
from tpusim.trace.ops import OpCost, counted_cost, reads_arguments

__all__ = ["OpCost", "counted_cost", "meta", "nbytes", "op_cost", "reads_arguments"]


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def meta(t: torch.Tensor) -> Meta:
    """A tensor (real or fake) as the cost rules read it."""
    return Meta(tuple(t.shape), str(t.dtype).removeprefix("torch."), t.element_size())


def _arg(a: object) -> object:
    return meta(a) if isinstance(a, torch.Tensor) else a


def op_cost(name: str, ins: list[torch.Tensor], outs: list[torch.Tensor], args: tuple) -> OpCost:
    """The cost of one op from its (device) inputs, outputs and arguments."""
    if not reads_arguments(name):
        return counted_cost(name, tuple(t.numel() for t in ins), tuple(t.numel() for t in outs if t is not None))
    return ops.op_cost(name, list(map(_arg, ins)), list(map(_arg, outs)), tuple(map(_arg, args)))
