"""Which ops a tpu tensor is still pending on, in Fused eager: the deferred graph TorchTPU's ``computation_mlir`` shows.

TorchTPU defers ops in Fused eager (DEFER_AND_FUSE) and keeps their graph until a materialization point; its
``sync.computation_mlir(t)`` prints that graph of a tensor as StableHLO. tpusim computes every value at once
(the simulator prices the deferral), so it keeps such a graph only while asked to: ``capturing()`` (entered
by torch_tpu's ``execution_mode`` context managers when the mode they set is Fused) watches each op on the
device with a ``TorchDispatchMode`` and notes, per tpu tensor it makes, the op and the arguments that made
it (``PendingGraph``). What ends the pending graph is TorchTPU's materialization: a host read (``.item()``,
``.cpu()``, a copy to the host), ``sync.synchronize``, ``Tensor.backward`` returning, the end of the block,
and, as tpusim's guard, ``tpusim.eager.windows.MAX_CLUSTER_OPS`` ops. ``graph_of(tensors)`` gives the pending
ops that produce ``tensors`` as an FX graph whose inputs are the values computed before (materialized).

Best effort, and so documented: outside such a block (a fused mode set by ``torch.tpu``, the environment or
``tpusim run --mode``), and for a tensor whose producer ran before the block, nothing is pending; a view is
followed as the op that made it, not through later writes to its base.
"""

from __future__ import annotations

import contextlib
import itertools
import operator
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.fx
from torch.utils import _pytree

from tpusim.backend.dispatch.dispatch_mode import DeviceDispatchMode
from tpusim.backend.program_trace import recorder
from tpusim.eager.windows import MAX_CLUSTER_OPS

aten = torch.ops.aten


@dataclass(eq=False)
class Node:
    """One pending op: the overload, its arguments with ``Ref``s in place of tensors, its tensor results."""

    seq: int
    op: torch._ops.OpOverload
    args: tuple
    kwargs: dict
    results: int


@dataclass(frozen=True)
class Ref:
    """A tensor an op read: result ``index`` of a pending ``node``, or (node None) a value computed before
    the pending graph began, named by ``key`` (its memory: the same bytes are the same graph input)."""

    node: Node | None
    index: int
    key: tuple
    shape: tuple[int, ...]
    dtype: torch.dtype


def _leaf_key(t: torch.Tensor) -> tuple:
    return (t.device.type, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)


@dataclass
class PendingGraph:
    """The pending ops of the block, by the Python identity of the tensors they made."""

    produced: dict[int, tuple[weakref.ref, Ref]] = field(default_factory=dict)
    nodes: int = 0
    seq: itertools.count = field(default_factory=itertools.count)

    def clear(self) -> None:
        """A materialization point: everything pending is computed; later ops read it as graph inputs."""
        self.produced.clear()
        self.nodes = 0

    def ref(self, t: torch.Tensor) -> Ref:
        found = self.produced.get(id(t))
        if found is not None and found[0]() is t:
            return found[1]
        return Ref(None, 0, _leaf_key(t), tuple(t.shape), t.dtype)

    def note(self, op: torch._ops.OpOverload, args: tuple, kwargs: dict, out: object) -> None:
        """One op ran: remember the tpu tensors it made (a host read or a copy to the host ends the graph)."""
        ins = [t for t in _pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        outs = [t for t in _pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        on_device = [t for t in outs if t.device.type == "tpu"]
        reads_device = any(t.device.type == "tpu" for t in ins)
        if op is aten._local_scalar_dense.default or (reads_device and not on_device):
            self.clear()
            return
        if not on_device:
            return
        if self.nodes >= MAX_CLUSTER_OPS:
            self.clear()
        node = Node(next(self.seq), op, *_pytree.tree_map_only(torch.Tensor, self.ref, (args, kwargs)), len(outs))
        self.nodes += 1
        for i, t in enumerate(outs):
            if t.device.type == "tpu":
                key = id(t)
                self.produced[key] = (weakref.ref(t, lambda _, key=key: self.produced.pop(key, None)),
                                      Ref(node, i, (), tuple(t.shape), t.dtype))

    def graph_of(self, tensors: list[torch.Tensor]) -> tuple[torch.fx.GraphModule, list[Ref]]:
        """The pending ops producing ``tensors`` as an FX graph returning them, and its inputs in order."""
        wanted = [self.ref(t) for t in tensors]
        nodes: dict[int, Node] = {}
        todo = [r.node for r in wanted if r.node is not None]
        while todo:
            node = todo.pop()
            if node.seq in nodes:
                continue
            nodes[node.seq] = node
            todo += [r.node for r in _refs((node.args, node.kwargs)) if r.node is not None]
        graph = torch.fx.Graph()
        inputs: dict[tuple, torch.fx.Node] = {}
        leaves: list[Ref] = []
        made: dict[int, torch.fx.Node] = {}

        def value(r: Ref) -> torch.fx.Node:
            if r.node is None:
                if r.key not in inputs:
                    inputs[r.key] = graph.placeholder(f"input_{len(leaves)}")
                    leaves.append(r)
                return inputs[r.key]
            produced = made[r.node.seq]
            return graph.call_function(operator.getitem, (produced, r.index)) if r.node.results > 1 else produced

        for seq in sorted(nodes):
            node = nodes[seq]
            args, kwargs = _pytree.tree_map_only(Ref, value, (node.args, node.kwargs))
            made[seq] = graph.call_function(node.op, args, kwargs)
        graph.output(tuple(value(r) for r in wanted))
        return torch.fx.GraphModule(torch.nn.Module(), graph), leaves


def _refs(tree: object) -> list[Ref]:
    return [r for r in _pytree.tree_leaves(tree) if isinstance(r, Ref)]


class _Watch(DeviceDispatchMode):
    """Hands each op on the device to the pending graph; off while torch.compile compiles."""

    def __init__(self, pending: PendingGraph) -> None:
        super().__init__()
        self.pending = pending

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def __torch_dispatch__(self, func: torch._ops.OpOverload, types: object, args: tuple = (),
                           kwargs: dict | None = None) -> object:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        try:
            self.pending.note(func, args, kwargs, out)
        except Exception:  # noqa: BLE001  (noting is a debugging aid: it never breaks the user's op)
            self.pending.clear()
        return out


PENDING = PendingGraph()          # the process's pending graph (empty outside a capturing block)
_DEPTH = [0]


@contextlib.contextmanager
def capturing() -> Iterator[PendingGraph]:
    """Note pending ops in the block (nested blocks share one graph); the block's end materializes them."""
    if _DEPTH[0]:
        _DEPTH[0] += 1
        try:
            yield PENDING
        finally:
            _DEPTH[0] -= 1
        return
    _DEPTH[0] = 1
    PENDING.clear()
    recorder.add_backward_listener(PENDING.clear)
    try:
        with _Watch(PENDING):
            yield PENDING
    finally:
        _DEPTH[0] = 0
        recorder.remove_backward_listener(PENDING.clear)
        PENDING.clear()


__all__ = ["PENDING", "Node", "PendingGraph", "Ref", "capturing"]
