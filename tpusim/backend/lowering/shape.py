"""Shape and view ops: view/reshape, permute, expand, squeeze, slice, select, cat, split, as_strided,
padding, flips, and the *_scatter ops functionalization emits for writes into views.

Functional graphs (what AOT autograd hands over) have no aliasing, so every "view" here returns
a value; the PJRT eager target keeps true views on the host (the shim's native view kernels).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from tpusim.backend.lowering.dtypes import jax_dtype, result_dtype
from tpusim.backend.lowering.registry import register

aten = torch.ops.aten


def _shape(x: jax.Array, size: Sequence[int]) -> tuple[int, ...]:
    size = list(size)
    if -1 in size:
        known = int(np.prod([s for s in size if s != -1])) if len(size) > 1 else 1
        size[size.index(-1)] = x.size // known if known else 0
    return tuple(size)


@register(aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.view_copy.default,
          aten._reshape_alias.default, aten._reshape_copy.default)
def _view(x: jax.Array, size: Sequence[int], *_: object) -> jax.Array:
    return jnp.reshape(x, _shape(x, size))


@register(aten.view.dtype)
def _view_dtype(x: jax.Array, dtype: torch.dtype) -> jax.Array:
    return lax.bitcast_convert_type(x, jax_dtype(dtype))


@register(aten.permute.default, aten.permute_copy.default)
def _permute(x: jax.Array, dims: Sequence[int]) -> jax.Array:
    return jnp.transpose(x, [d % x.ndim for d in dims]) if x.ndim else x


@register(aten.transpose.int)
def _transpose(x: jax.Array, d0: int, d1: int) -> jax.Array:
    return jnp.swapaxes(x, d0, d1) if x.ndim else x


@register(aten.t.default, aten.numpy_T.default)
def _t(x: jax.Array) -> jax.Array:
    return x.T


@register(aten.expand.default, aten.expand_copy.default)
def _expand(x: jax.Array, size: Sequence[int], *, implicit: bool = False) -> jax.Array:
    size = list(size)
    lead = len(size) - x.ndim
    shape = [x.shape[i - lead] if s == -1 else s for i, s in enumerate(size)]
    return jnp.broadcast_to(x, shape)


@register(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze_copy.dims)
def _squeeze(x: jax.Array, dim: object = None) -> jax.Array:
    if x.ndim == 0:
        return x
    dims = range(x.ndim) if dim is None else ([dim] if isinstance(dim, int) else dim)
    axes = tuple(d % x.ndim for d in dims if x.shape[d % x.ndim] == 1)
    return jnp.squeeze(x, axes) if axes else x


@register(aten.unsqueeze.default, aten.unsqueeze_copy.default)
def _unsqueeze(x: jax.Array, dim: int) -> jax.Array:
    return jnp.expand_dims(x, dim % (x.ndim + 1))


@register(aten.alias.default, aten.detach.default, aten.detach_copy.default, aten.lift_fresh_copy.default,
          aten.alias_copy.default,
          aten.lift_fresh.default, aten.positive.default, aten.resolve_conj.default, aten.resolve_neg.default,
          aten.conj.default)
def _alias(x: jax.Array) -> jax.Array:
    return x


@register(aten.clone.default, aten.contiguous.default)
def _clone(x: jax.Array, *, memory_format: object = None) -> jax.Array:
    return jnp.array(x, copy=True)


def _clamp_index(i: int | None, n: int, default: int) -> int:
    if i is None:
        return default
    if i < 0:
        i += n
    return min(max(i, 0), n)


@register(aten.slice.Tensor, aten.slice_copy.Tensor)
def _slice(x: jax.Array, dim: int = 0, start: int | None = None, end: int | None = None, step: int = 1) -> jax.Array:
    dim %= x.ndim
    n = x.shape[dim]
    s, e = _clamp_index(start, n, 0), _clamp_index(end, n, n)
    e = max(e, s)
    return lax.slice_in_dim(x, s, e, step, axis=dim)


@register(aten.narrow.default, aten.narrow_copy.default)
def _narrow(x: jax.Array, dim: int, start: int, length: int) -> jax.Array:
    start = start + x.shape[dim] if start < 0 else start
    return _slice(x, dim, start, start + length)


@register(aten.select.int, aten.select_copy.int)
def _select(x: jax.Array, dim: int, index: int) -> jax.Array:
    dim %= x.ndim
    return lax.index_in_dim(x, index % x.shape[dim], axis=dim, keepdims=False)


@register(aten.cat.default)
def _cat(tensors: Sequence[jax.Array], dim: int = 0) -> jax.Array:
    live = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)]   # legacy: 1-D empties are skipped
    dtype = result_dtype(*tensors)
    if not live:
        return jnp.zeros((0,), dtype)
    return jnp.concatenate([t.astype(dtype) for t in live], axis=dim % live[0].ndim)


@register(aten.stack.default)
def _stack(tensors: Sequence[jax.Array], dim: int = 0) -> jax.Array:
    dtype = result_dtype(*tensors)
    return jnp.stack([t.astype(dtype) for t in tensors], axis=dim)


@register(aten.split_with_sizes.default, aten.split_with_sizes_copy.default)
def _split_with_sizes(x: jax.Array, sizes: Sequence[int], dim: int = 0) -> list[jax.Array]:
    dim %= x.ndim
    out, start = [], 0
    for s in sizes:
        out.append(lax.slice_in_dim(x, start, start + s, axis=dim))
        start += s
    return out


@register(aten.split.Tensor, aten.split_copy.Tensor)
def _split(x: jax.Array, size: int, dim: int = 0) -> list[jax.Array]:
    n = x.shape[dim % x.ndim]
    sizes = [min(size, n - i) for i in range(0, n, size)] if size else [0]
    return _split_with_sizes(x, sizes or [0], dim)


@register(aten.unbind.int, aten.unbind_copy.int)
def _unbind(x: jax.Array, dim: int = 0) -> list[jax.Array]:
    dim %= x.ndim
    return [lax.index_in_dim(x, i, axis=dim, keepdims=False) for i in range(x.shape[dim])]


def _strided_index(size: Sequence[int], stride: Sequence[int], offset: int) -> np.ndarray:
    idx = np.full(tuple(size), offset, dtype=np.int64)
    for d, (n, s) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[d] = n
        idx = idx + (np.arange(n, dtype=np.int64) * s).reshape(shape)
    return idx


@register(aten.as_strided.default, aten.as_strided_copy.default)
def _as_strided(x: jax.Array, size: Sequence[int], stride: Sequence[int],
                storage_offset: int | None = None) -> jax.Array:
    """Read the input as a contiguous storage (functional graphs hand over the base) at strided offsets."""
    return x.reshape(-1)[_strided_index(size, stride, storage_offset or 0)]


@register(aten.as_strided_scatter.default)
def _as_strided_scatter(x: jax.Array, src: jax.Array, size: Sequence[int], stride: Sequence[int],
                        storage_offset: int | None = None) -> jax.Array:
    idx = _strided_index(size, stride, storage_offset or 0)
    return x.reshape(-1).at[idx].set(src.astype(x.dtype)).reshape(x.shape)


@register(aten.diagonal.default, aten.diagonal_copy.default)
def _diagonal(x: jax.Array, offset: int = 0, dim1: int = 0, dim2: int = 1) -> jax.Array:
    return jnp.diagonal(x, offset, dim1 % x.ndim, dim2 % x.ndim)


@register(aten.diagonal_scatter.default)
def _diagonal_scatter(x: jax.Array, src: jax.Array, offset: int = 0, dim1: int = 0, dim2: int = 1) -> jax.Array:
    d1, d2 = dim1 % x.ndim, dim2 % x.ndim
    n = jnp.diagonal(x, offset, d1, d2).shape[-1]
    rows = np.arange(n) + max(-offset, 0)
    cols = np.arange(n) + max(offset, 0)
    moved = jnp.moveaxis(x, (d1, d2), (-2, -1))
    moved = moved.at[..., rows, cols].set(src.astype(x.dtype))
    return jnp.moveaxis(moved, (-2, -1), (d1, d2))


@register(aten.select_scatter.default)
def _select_scatter(x: jax.Array, src: jax.Array, dim: int, index: int) -> jax.Array:
    dim %= x.ndim
    index %= x.shape[dim]
    return lax.dynamic_update_index_in_dim(x, src.astype(x.dtype), index, axis=dim)


@register(aten.slice_scatter.default)
def _slice_scatter(x: jax.Array, src: jax.Array, dim: int = 0, start: int | None = None, end: int | None = None,
                   step: int = 1) -> jax.Array:
    dim %= x.ndim
    n = x.shape[dim]
    s, e = _clamp_index(start, n, 0), _clamp_index(end, n, n)
    index = [slice(None)] * x.ndim
    index[dim] = slice(s, max(e, s), step)
    return x.at[tuple(index)].set(src.astype(x.dtype))


@register(aten.flip.default)
def _flip(x: jax.Array, dims: Sequence[int]) -> jax.Array:
    return jnp.flip(x, [d % x.ndim for d in dims]) if x.ndim else x


@register(aten.roll.default)
def _roll(x: jax.Array, shifts: Sequence[int], dims: Sequence[int] = ()) -> jax.Array:
    if not dims:
        return jnp.roll(x.reshape(-1), shifts[0]).reshape(x.shape)
    return jnp.roll(x, shifts, dims)


@register(aten.repeat.default)
def _repeat(x: jax.Array, repeats: Sequence[int]) -> jax.Array:
    x = x.reshape((1,) * (len(repeats) - x.ndim) + x.shape)
    return jnp.tile(x, repeats)


@register(aten.constant_pad_nd.default)
def _constant_pad_nd(x: jax.Array, pad: Sequence[int], value: float = 0) -> jax.Array:
    """Torch lists (low, high) pairs from the last dim backwards; negative pads crop."""
    cfg = [(0, 0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        cfg[x.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1], 0)
    return lax.pad(x, jnp.asarray(value, x.dtype), cfg)


def _pad_mode(x: jax.Array, pad: Sequence[int], mode: str) -> jax.Array:
    width = [(0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        width[x.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    return jnp.pad(x, width, mode=mode)


@register(aten.reflection_pad1d.default, aten.reflection_pad2d.default, aten.reflection_pad3d.default)
def _reflection_pad(x: jax.Array, padding: Sequence[int]) -> jax.Array:
    return _pad_mode(x, padding, "reflect")


@register(aten.replication_pad1d.default, aten.replication_pad2d.default, aten.replication_pad3d.default)
def _replication_pad(x: jax.Array, padding: Sequence[int]) -> jax.Array:
    return _pad_mode(x, padding, "edge")


@register(aten.tril.default)
def _tril(x: jax.Array, diagonal: int = 0) -> jax.Array:
    return jnp.tril(x, diagonal)


@register(aten.triu.default)
def _triu(x: jax.Array, diagonal: int = 0) -> jax.Array:
    return jnp.triu(x, diagonal)


@register(aten.unfold.default)
def _unfold(x: jax.Array, dim: int, size: int, step: int) -> jax.Array:
    if x.ndim == 0:
        return x.reshape(1)
    dim %= x.ndim
    n = (x.shape[dim] - size) // step + 1
    idx = np.arange(n)[:, None] * step + np.arange(size)[None, :]
    out = jnp.take(x, idx, axis=dim)               # (..., n, size, ...)
    return jnp.moveaxis(out, dim + 1, -1)


@register(aten.sym_size.int)
def _sym_size(x: jax.Array, dim: int) -> int:
    return x.shape[dim]


@register(aten.sym_numel.default)
def _sym_numel(x: jax.Array) -> int:
    return x.size


@register(aten.sym_stride.int)
def _sym_stride(x: jax.Array, dim: int) -> int:
    return int(np.prod(x.shape[dim % x.ndim + 1:]))


@register(aten.sym_is_contiguous.default)
def _sym_is_contiguous(x: jax.Array, memory_format: object = None) -> bool:
    return True                                   # jax arrays are always dense row-major values


@register(aten.sym_storage_offset.default)
def _sym_storage_offset(x: jax.Array) -> int:
    return 0


