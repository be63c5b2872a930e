"""torch_tpu's ``_internal.sync``: materialize pending tpu tensors, and show the computation one is pending on.

    sync.synchronize(loss)                       # or a list, or None for everything pending; wait=True blocks
    text = sync.computation_mlir(z)              # StableHLO of the ops z is still pending on (Fused eager)

``synchronize``: tpusim computes values at once on the simulator target, so this runs the PJRT target's
pending fused window (if any), ends the pending graph of tpusim/backend/torchtpu/deferred.py and, while
recording, marks a host sync in the trace (as ``torch.tpu.synchronize``), which ends a Fused eager cluster
there as TorchTPU's materialization does.

``computation_mlir(*tensors)``: the StableHLO text (as ``jax.jit(...).lower(...).as_text()`` prints it, for
TPU) of the pending ops producing the tensors, lowered through tpusim's ATen -> JAX table
(tpusim/backend/lowering/); values computed before are the module's arguments. Best effort: ops are pending
only inside torch_tpu's ``execution_mode`` blocks that set Fused eager (deferred.py says why); elsewhere, as
for TorchTPU's Strict eager, a tensor is materialized and its module just returns its argument. Python scalars
are inlined as constants, as TorchTPU's are. ``computation_graphviz`` draws the same graph in DOT.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch
from torch.utils import _pytree

from tpusim.backend.plumbing.state import STATE
from tpusim.backend.program_trace import recorder
from tpusim.backend.targets import flush_pending
from tpusim.backend.torchtpu.deferred import PENDING
from tpusim.eager.windows import LAUNCH_REASON
from tpusim.errors import TpusimError


def _local(t: object) -> torch.Tensor:
    """A DTensor's local shard (what TorchTPU synchronizes); plain tensors as they are."""
    local = getattr(t, "_local_tensor", None)
    if isinstance(local, torch.Tensor):
        return local
    if not isinstance(t, torch.Tensor):
        raise TpusimError(f"torch_tpu sync: expected tensors, got {type(t).__name__}")
    return t


def _tensors(where: str, values: tuple) -> list[torch.Tensor]:
    leaves = _pytree.tree_leaves(values)
    if not leaves:
        raise TpusimError(f"torch_tpu {where}: give at least one tensor")
    return [_local(t) for t in leaves]


def synchronize(tensors: torch.Tensor | Sequence[torch.Tensor] | None = None, wait: bool = False) -> None:
    """Materialize ``tensors`` (None: everything pending). ``wait=True`` is a host sync in the trace (the host
    waits for the device); ``wait=False``, TorchTPU's default, launches the pending work and goes on: a Fused
    eager cut without a wait (TorchTPU's graph split, e.g. between a step's forward and backward)."""
    if tensors is not None:
        _tensors("synchronize", (tensors,))
    flush_pending("sync")
    PENDING.clear()
    if STATE.recording:
        if wait:
            recorder.record_host("sync", "synchronize")
        else:
            recorder.mark_cut(LAUNCH_REASON)


def is_materialized(tensor: torch.Tensor) -> bool:
    """False while ``tensor`` is pending on ops of a Fused eager block (deferred.py), else True."""
    return PENDING.ref(_local(tensor)).node is None


is_ready = is_materialized


def is_materializing(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s program is running: never here (values are computed at once)."""
    _local(tensor)
    return False


def is_bufferless_zero_size(tensor: torch.Tensor) -> bool:
    """A tensor of no elements owns no device buffer."""
    return _local(tensor).numel() == 0


def _graph(where: str, tensors: tuple) -> tuple[torch.fx.GraphModule, list]:
    return PENDING.graph_of(_tensors(where, tensors))


def computation_mlir(*tensors: torch.Tensor | Sequence[torch.Tensor]) -> str:
    """StableHLO text of the pending computation of ``tensors`` (see the module docstring)."""
    import jax

    from tpusim.backend.lowering import MissingLowering, jax_function
    from tpusim.backend.lowering.dtypes import jax_dtype
    from tpusim.backend.lowering.interpreter import needs_random

    gm, inputs = _graph("computation_mlir", tensors)
    specs = [jax.ShapeDtypeStruct(r.shape, jax_dtype(r.dtype)) for r in inputs]
    if needs_random(gm):
        specs.append(jax.ShapeDtypeStruct((2,), "uint32"))
    try:
        traced = jax.jit(jax_function(gm)).trace(*specs)
    except MissingLowering as error:
        raise TpusimError(f"torch_tpu computation_mlir: {error}") from None
    try:
        return traced.lower(lowering_platforms=("tpu",)).as_text()
    except Exception:  # noqa: BLE001  (a rule without a TPU lowering: the same module for JAX's own device)
        return traced.lower().as_text()


def computation_graphviz(*tensors: torch.Tensor | Sequence[torch.Tensor]) -> str:
    """The pending computation of ``tensors`` as a Graphviz DOT digraph (an op a node, its reads the edges)."""
    gm, _ = _graph("computation_graphviz", tensors)
    lines = ["digraph computation {"]
    for node in gm.graph.nodes:
        label = node.name if node.op != "call_function" else str(getattr(node.target, "_name", node.target))
        lines.append(f'  {node.name} [label="{label}"];')
        lines += [f"  {a.name} -> {node.name};" for a in node.all_input_nodes]
    lines.append("}")
    return "\n".join(lines)


def _dump(text: str, file_name: str | os.PathLike) -> None:
    directory = os.path.dirname(os.fspath(file_name))
    if directory:
        os.makedirs(directory, exist_ok=True)
    with open(file_name, "w") as out:
        out.write(text)


def dump_computation_mlir(tensors: Sequence[torch.Tensor], file_name: str | os.PathLike) -> None:
    _dump(computation_mlir(*tensors), file_name)


def dump_computation_graphviz(tensors: Sequence[torch.Tensor], file_name: str | os.PathLike) -> None:
    _dump(computation_graphviz(*tensors), file_name)


__all__ = ["computation_graphviz", "computation_mlir", "dump_computation_graphviz", "dump_computation_mlir",
           "is_bufferless_zero_size", "is_materialized", "is_materializing", "is_ready", "synchronize"]
