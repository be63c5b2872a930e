"""Gathers and scatters: index, index_put, gather, scatter*, index_select, embedding, masked ops.

Torch's advanced indexing (a list of optional index tensors, None = whole dim) is numpy's, so it
maps onto jax indexing directly; boolean masks make the shape data-dependent and only run
un-jitted (eager PJRT handles that by retrying without jit; compiled graphs never see them:
Dynamo graph-breaks or AOT specialises on them).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import torch
from jax import lax

from tpusim.backend.lowering.dtypes import as_array
from tpusim.backend.lowering.registry import register

aten = torch.ops.aten


def _index_tuple(indices: Sequence[jax.Array | None]) -> tuple:
    return tuple(slice(None) if i is None else i for i in indices)


@register(aten.index.Tensor, aten._unsafe_index.Tensor)
def _index(x: jax.Array, indices: Sequence[jax.Array | None]) -> jax.Array:
    return x[_index_tuple(indices)]


@register(aten.index_put.default, aten._unsafe_index_put.default, aten._index_put_impl.default)
def _index_put(x: jax.Array, indices: Sequence[jax.Array | None], values: jax.Array, accumulate: bool = False,
               unsafe: bool = False) -> jax.Array:
    values = as_array(values, x.dtype)
    mask = _leading_mask(x, indices)
    if mask is not None and values.size == 1:
        # ``x[mask] = v`` (quantisers' ``signs[signs == 0] = 1``): a boolean mask has a data-dependent number of
        # elements, which jit refuses, but with one value the write is a select over the whole array
        where = mask.reshape(mask.shape + (1,) * (x.ndim - mask.ndim))
        update = x + values.reshape(()) if accumulate else values.reshape(())
        return jnp.where(where, update, x)
    ref = x.at[_index_tuple(indices)]
    return ref.add(values) if accumulate else ref.set(values)


@register(aten._assert_async)
def _assert_async(_condition: jax.Array, _message: str = "") -> None:
    """``torch._assert_async`` (what ``F.one_hot``'s decomposition and bounds checks trace to) does nothing: a TPU
    program has no device-side assert (XLA drops it), so a compiled graph checks nothing, as on a TPU."""
    return None


def _leading_mask(x: jax.Array, indices: Sequence[jax.Array | None]) -> jax.Array | None:
    """The boolean mask when the only index is one over ``x``'s leading dims (None otherwise)."""
    if len(indices) != 1 or indices[0] is None or indices[0].dtype != jnp.bool_:
        return None
    mask = indices[0]
    return mask if mask.shape == x.shape[:mask.ndim] else None


def _full_index(index: jax.Array, dim: int) -> tuple:
    """Index arrays addressing ``index``'s own positions, with ``dim`` replaced by its values."""
    grids = [lax.broadcasted_iota(jnp.int64, index.shape, d) for d in range(index.ndim)]
    grids[dim] = index
    return tuple(grids)


@register(aten.gather.default)
def _gather(x: jax.Array, dim: int, index: jax.Array, *, sparse_grad: bool = False) -> jax.Array:
    if x.ndim == 0:
        return x.reshape(index.shape)
    dim %= x.ndim
    return x[_full_index(index, dim)]


def _scatter(x: jax.Array, dim: int, index: jax.Array, src: object, mode: str) -> jax.Array:
    if x.ndim == 0:
        x, index = x.reshape(1), index.reshape(1)
        src = src.reshape(1) if isinstance(src, jax.Array) else src
        return _scatter(x, 0, index, src, mode).reshape(())
    dim %= x.ndim
    if isinstance(src, jax.Array) and src.ndim:
        src = src[tuple(slice(0, n) for n in index.shape)]
    ref = x.at[_full_index(index, dim)]
    src = as_array(src, x.dtype)
    return {"set": ref.set, "add": ref.add, "multiply": ref.multiply, "prod": ref.multiply, "sum": ref.add,
            "amax": ref.max, "amin": ref.min}[mode](src)


@register(aten.scatter.src, aten.scatter.value)
def _scatter_src(x: jax.Array, dim: int, index: jax.Array, src: object) -> jax.Array:
    return _scatter(x, dim, index, src, "set")


@register(aten.scatter.reduce, aten.scatter.value_reduce)
def _scatter_reduce_legacy(x: jax.Array, dim: int, index: jax.Array, src: object, *, reduce: str) -> jax.Array:
    return _scatter(x, dim, index, src, {"add": "add", "multiply": "multiply"}[reduce])


@register(aten.scatter_add.default)
def _scatter_add(x: jax.Array, dim: int, index: jax.Array, src: jax.Array) -> jax.Array:
    return _scatter(x, dim, index, src, "add")


@register(aten.scatter_reduce.two)
def _scatter_reduce(x: jax.Array, dim: int, index: jax.Array, src: jax.Array, reduce: str, *,
                    include_self: bool = True) -> jax.Array:
    if reduce == "mean":
        base = x if include_self else jnp.zeros_like(x)
        total = _scatter(base, dim, index, src, "add")
        count = _scatter(jnp.full(x.shape, 1 if include_self else 0, x.dtype), dim, index,
                         jnp.ones(index.shape, x.dtype), "add")
        count = jnp.maximum(count, 1)
        out = total // count if jnp.issubdtype(x.dtype, jnp.integer) else total / count
        touched = _scatter(jnp.zeros(x.shape, jnp.bool_), dim, index, True, "set")
        return jnp.where(touched, out.astype(x.dtype), x)
    if not include_self:
        identity = {"sum": 0, "prod": 1, "amax": -jnp.inf, "amin": jnp.inf}[reduce]
        if jnp.issubdtype(x.dtype, jnp.integer):
            info = jnp.iinfo(x.dtype)
            identity = {"amax": info.min, "amin": info.max}.get(reduce, identity)
        touched = _scatter(jnp.zeros(x.shape, jnp.bool_), dim, index, True, "set")
        reduced = _scatter(jnp.full(x.shape, identity, x.dtype), dim, index, src, reduce)
        return jnp.where(touched, reduced, x)
    return _scatter(x, dim, index, src, reduce)


@register(aten.index_select.default)
def _index_select(x: jax.Array, dim: int, index: jax.Array) -> jax.Array:
    if x.ndim == 0:
        return x
    return jnp.take(x, index.reshape(-1), axis=dim % x.ndim)


@register(aten.index_add.default)
def _index_add(x: jax.Array, dim: int, index: jax.Array, source: jax.Array, *, alpha: object = 1) -> jax.Array:
    dim %= max(x.ndim, 1)
    if x.ndim == 0:
        return x + source * alpha
    loc = [slice(None)] * x.ndim
    loc[dim] = index
    return x.at[tuple(loc)].add((source * alpha).astype(x.dtype))


@register(aten.index_copy.default)
def _index_copy(x: jax.Array, dim: int, index: jax.Array, source: jax.Array) -> jax.Array:
    if x.ndim == 0:
        return source.reshape(())
    loc = [slice(None)] * x.ndim
    loc[dim % x.ndim] = index
    return x.at[tuple(loc)].set(source.astype(x.dtype))


@register(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor)
def _index_fill(x: jax.Array, dim: int, index: jax.Array, value: object) -> jax.Array:
    if x.ndim == 0:
        return as_array(value, x.dtype).reshape(())
    loc = [slice(None)] * x.ndim
    loc[dim % x.ndim] = index.reshape(-1)
    return x.at[tuple(loc)].set(as_array(value, x.dtype))


@register(aten.take.default)
def _take(x: jax.Array, index: jax.Array) -> jax.Array:
    return x.reshape(-1)[index]


@register(aten.embedding.default)
def _embedding(weight: jax.Array, indices: jax.Array, padding_idx: int = -1, scale_grad_by_freq: bool = False,
               sparse: bool = False) -> jax.Array:
    return jnp.take(weight, indices, axis=0)


@register(aten.embedding_dense_backward.default)
def _embedding_dense_backward(grad: jax.Array, indices: jax.Array, num_weights: int, padding_idx: int,
                              scale_grad_by_freq: bool) -> jax.Array:
    flat = indices.reshape(-1)
    g = grad.reshape(flat.shape[0], -1)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), g.dtype).at[flat].add(1)
        g = g / counts[flat][:, None]
    if padding_idx >= 0:
        g = jnp.where((flat == padding_idx)[:, None], 0, g)
    return jnp.zeros((num_weights, g.shape[1]), grad.dtype).at[flat].add(g)


@register(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(x: jax.Array, mask: jax.Array, value: object) -> jax.Array:
    return jnp.where(mask, as_array(value, x.dtype), x)


@register(aten.masked_scatter.default)
def _masked_scatter(x: jax.Array, mask: jax.Array, source: jax.Array) -> jax.Array:
    shape = jnp.broadcast_shapes(x.shape, mask.shape)
    x, mask = jnp.broadcast_to(x, shape), jnp.broadcast_to(mask, shape)
    flat = mask.reshape(-1)
    pos = jnp.clip(jnp.cumsum(flat) - 1, 0, max(source.size - 1, 0))
    values = source.reshape(-1)[pos].reshape(shape) if source.size else x
    return jnp.where(mask, values.astype(x.dtype), x)


@register(aten.nonzero.default, jit=False)
def _nonzero(x: jax.Array) -> jax.Array:
    if x.ndim == 0:
        return jnp.zeros((int(x != 0), 0), jnp.int64)
    return jnp.stack(jnp.nonzero(x), axis=1).astype(jnp.int64)


@register(aten.masked_select.default, jit=False)
def _masked_select(x: jax.Array, mask: jax.Array) -> jax.Array:
    shape = jnp.broadcast_shapes(x.shape, mask.shape)
    return jnp.broadcast_to(x, shape)[jnp.broadcast_to(mask, shape)]


@register(aten.bucketize.Tensor)
def _bucketize(x: jax.Array, boundaries: jax.Array, *, out_int32: bool = False, right: bool = False) -> jax.Array:
    out = jnp.searchsorted(boundaries, x, side="right" if right else "left")
    return out.astype(jnp.int32 if out_int32 else jnp.int64)


@register(aten.searchsorted.Tensor)
def _searchsorted(sorted_seq: jax.Array, x: jax.Array, *, out_int32: bool = False, right: bool = False,
                  side: str | None = None, sorter: jax.Array | None = None) -> jax.Array:
    side = side or ("right" if right else "left")
    if sorter is not None:
        sorted_seq = jnp.take_along_axis(sorted_seq, sorter, axis=-1)
    if sorted_seq.ndim <= 1:
        out = jnp.searchsorted(sorted_seq, x, side=side)
    else:
        flat_s = sorted_seq.reshape(-1, sorted_seq.shape[-1])
        flat_x = x.reshape(flat_s.shape[0], -1)
        out = jax.vmap(lambda a, v: jnp.searchsorted(a, v, side=side))(flat_s, flat_x).reshape(x.shape)
    return out.astype(jnp.int32 if out_int32 else jnp.int64)
