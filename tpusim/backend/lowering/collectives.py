"""PyTorch's functional collectives as JAX collectives over one mesh axis, for a graph lowered whole.

A torch.compile graph with functional collectives (DTensor, FSDP2, funcol) runs as segments with c10d
between them (tpusim/backend/torch_compile/collective_graph.py). For the TPU compiler the same graph is also lowered
whole, inside ``jax.shard_map`` over a one-axis mesh of the collectives' group (``AXIS``): every device runs
the same per-device program, as tpusim's symmetry rule has it, and XLA schedules the collectives
(async, overlapped, decomposed) as it would on a TPU. The table here is passed to ``jax_function`` as
``extra``: outside a shard_map these lowerings mean nothing, so they are not in the main table.
Adding a collective = one entry in ``COLLECTIVES``.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import torch
from jax import lax

AXIS = "tpusim_group"
c10d = torch.ops._c10d_functional


def _reduce(x: jax.Array, reduce_op: str) -> jax.Array:
    op = reduce_op.lower()
    if op in ("sum", "avg"):
        return lax.pmean(x, AXIS) if op == "avg" else lax.psum(x, AXIS)
    if op in ("max", "min"):
        return (lax.pmax if op == "max" else lax.pmin)(x, AXIS)
    raise NotImplementedError(f"all_reduce with reduce_op {reduce_op!r}")


def _reduce_scatter(x: jax.Array, reduce_op: str, group_size: int, _group: object) -> jax.Array:
    if reduce_op.lower() not in ("sum", "avg"):
        raise NotImplementedError(f"reduce_scatter with reduce_op {reduce_op!r}")
    out = lax.psum_scatter(x, AXIS, scatter_dimension=0, tiled=True)
    return out / group_size if reduce_op.lower() == "avg" else out


def _all_gather(x: jax.Array, _group_size: int, _group: object) -> jax.Array:
    return lax.all_gather(x, AXIS, axis=0, tiled=True)


def _all_to_all(x: jax.Array, output_splits: list, input_splits: list, _group: object) -> jax.Array:
    if len(set(output_splits or [0])) > 1 or len(set(input_splits or [0])) > 1:
        raise NotImplementedError("all_to_all_single with uneven splits")
    return lax.all_to_all(x, AXIS, 0, 0, tiled=True)


COLLECTIVES: dict[object, Callable] = {
    c10d.all_gather_into_tensor: _all_gather,
    c10d.reduce_scatter_tensor: _reduce_scatter,
    c10d.all_reduce: lambda x, reduce_op, _group: _reduce(x, reduce_op),
    c10d.all_to_all_single: _all_to_all,
    c10d.wait_tensor: lambda x: x,
    c10d.all_gather_into_tensor_coalesced: lambda xs, n, g: [_all_gather(x, n, g) for x in xs],
    c10d.reduce_scatter_tensor_coalesced: lambda xs, op, n, g: [_reduce_scatter(x, op, n, g) for x in xs],
    c10d.all_reduce_coalesced: lambda xs, op, _group: [_reduce(x, op) for x in xs],
}
