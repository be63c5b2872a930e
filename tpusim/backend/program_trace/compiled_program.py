"""A torch.compile'd graph as the simulator prices it: its ops, their costs and the values they pass.

Why: on the sim target a compiled graph runs through JAX on the host, so no op reaches the
fallback and nothing would be recorded. ``program_of`` walks the Core ATen graph once (at
compile time) and prices each op with the same cost rules as eager ops (tpusim/trace/ops.py, on
the graph's fake tensors' metadata); ``recorder.record_program`` replays that list at every execution
with the real input and output tensors bound, so the simulator sees the same program the
device ran and fuses it as a whole (tpusim/eager/fusion.py).

What is not an op here: views (reshape, permute, expand, slice, ...: layout in XLA, they only
rename a value) and ``getitem`` of a multi-output op. Copies and dtype conversions are DMA
work in eager mode but elementwise VPU work inside a program (XLA fuses converts, copies and
concatenations into their neighbours), one operation per output element.
"""

from __future__ import annotations

import operator
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.fx

from tpusim.backend.aten import op_schema
from tpusim.backend.plumbing.source import is_internal_file
from tpusim.backend.program_trace import costs
from tpusim.trace.ops import Family


@dataclass(frozen=True)
class ProgramValue:
    """A tensor the graph passes: its shape, and the value whose memory it views (itself if none)."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    nbytes: int
    base: int


@dataclass(frozen=True)
class ProgramOp:
    name: str                       # "aten::mm"
    reads: tuple[int, ...]          # value indices
    writes: tuple[int, ...]
    cost: costs.OpCost
    source: str                     # "file.py:line" of the user's code that traced to it


@dataclass(frozen=True)
class Program:
    label: str                      # "graph 0 (forward)"
    values: tuple[ProgramValue, ...]
    ops: tuple[ProgramOp, ...]
    inputs: tuple[int | None, ...]  # value of each graph input (None: not a tensor)
    outputs: tuple[int | None, ...]  # value of each graph output
    stablehlo: Callable[[], str] | None = None   # the graph lowered for TPU (tpusim/xla/ compiles it), on demand

    def updated_inputs(self) -> tuple[tuple[int, int], ...]:
        """(output value, input value) pairs: an output an op made from an input of the same shape and dtype (a
        functionalised in-place update: a KV cache's ``index_copy_`` became ``index_put(cache, ...)``). AOT
        autograd writes such an output back with ``input.copy_(output)`` after the graph; XLA runs the update in
        place in the donated input's buffer instead, so that copy moves nothing (recorder.record_program)."""
        inputs, outputs = set(self.inputs) - {None}, set(self.outputs) - {None}
        pairs = []
        for op in self.ops:
            if not op.reads or op.reads[0] not in inputs:
                continue
            source = self.values[op.reads[0]]
            pairs += [(w, op.reads[0]) for w in op.writes if w in outputs
                      and (self.values[w].shape, self.values[w].dtype) == (source.shape, source.dtype)]
        return tuple(pairs)


_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def _source(node: torch.fx.Node) -> str:
    """The innermost user frame (not torch's) of the node's traced stack, as "file.py:line"; "" when the
    traced code is all torch's (an nn.Sequential of torch layers): the caller's line is used then."""
    frames = [f for f in _FRAME.findall(node.meta.get("stack_trace") or "") if not is_internal_file(f[0])]
    return f"{os.path.basename(frames[-1][0])}:{frames[-1][1]}" if frames else ""


class _Builder:
    def __init__(self) -> None:
        self.values: list[ProgramValue] = []
        self.of: dict[tuple[torch.fx.Node, int], int] = {}     # (node, output index) -> value

    def add(self, node: torch.fx.Node, k: int, fake: torch.Tensor, base: int | None = None) -> int:
        v = len(self.values)
        self.values.append(ProgramValue(tuple(int(s) for s in fake.shape), fake.dtype,
                                        int(fake.numel()) * fake.element_size(), v if base is None else base))
        self.of[(node, k)] = v
        return v

    def value(self, arg: object) -> int | None:
        return self.of.get((arg, 0)) if isinstance(arg, torch.fx.Node) else None


def _fakes(val: object) -> list[torch.Tensor | None]:
    vals = val if isinstance(val, (tuple, list)) else [val]
    return [v if isinstance(v, torch.Tensor) else None for v in vals]


def _meta_args(args: object) -> object:
    """Node arguments with each node replaced by its fake value (what the cost rules read)."""
    return torch.fx.node.map_arg(args, lambda n: n.meta.get("val"))


def program_of(gm: torch.fx.GraphModule, label: str, stablehlo: Callable[[], str] | None = None) -> Program:
    """The ops and values of one Core ATen graph (see the module docstring); ``stablehlo`` lowers it for TPU."""
    b = _Builder()
    ops: list[ProgramOp] = []
    inputs: list[int | None] = []
    outputs: tuple[int | None, ...] = ()
    for node in gm.graph.nodes:
        fakes = _fakes(node.meta.get("val"))
        if node.op == "placeholder":
            inputs.append(b.add(node, 0, fakes[0]) if fakes[0] is not None else None)
        elif node.op == "output":
            outs = node.args[0] if isinstance(node.args[0], (tuple, list)) else [node.args[0]]
            outputs = tuple(b.value(o) for o in outs)
        elif node.op == "call_function" and node.target is operator.getitem:
            source, index = node.args
            if (source, index) in b.of:
                b.of[(node, 0)] = b.of[(source, index)]
        elif node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            if op_schema.facts(node.target).returns_view:
                base = b.value(node.args[0])
                if base is not None and fakes[0] is not None:
                    b.add(node, 0, fakes[0], b.values[base].base)
                continue
            ops.append(_op(b, node, fakes))
    return Program(label, tuple(b.values), tuple(ops), tuple(inputs), outputs, stablehlo)


def _op(b: _Builder, node: torch.fx.Node, fakes: list[torch.Tensor | None]) -> ProgramOp:
    name = node.target._schema.name
    arg_nodes = [a for a in node.all_input_nodes if b.value(a) is not None]
    reads = tuple(b.value(a) for a in arg_nodes)
    writes = tuple(b.add(node, k, f) for k, f in enumerate(fakes) if f is not None)
    ins = [a.meta["val"] for a in arg_nodes]
    outs = [f for f in fakes if f is not None]
    args = _meta_args(node.args)
    try:
        cost = costs.op_cost(name, ins, outs, args if isinstance(args, tuple) else (args,))
    except Exception:  # a cost rule must never break the user's program
        cost = costs.OpCost(Family.ELEMENTWISE)
    if cost.family == Family.DATA_MOVEMENT:     # inside XLA a copy/convert/concat is elementwise work, fused
        cost = costs.OpCost(Family.ELEMENTWISE, float(sum(f.numel() for f in outs)))
    return ProgramOp(name, reads, writes, cost, _source(node))
