"""Reductions, scans and sorts: sum, mean, var, amax, argmax, max.dim, cumsum, sort, topk, ...

PyTorch conventions kept here: integer/bool sums accumulate in int64; ``dim=None`` or ``[]``
reduces everything; half types accumulate in float32 and cast back; argmax/argmin return int64.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import torch
from jax import lax

from tpusim.backend.lowering.dtypes import jax_dtype
from tpusim.backend.lowering.registry import register

aten = torch.ops.aten
_HALF = (jnp.float16, jnp.bfloat16)


def _axes(x: jax.Array, dim: object) -> tuple[int, ...] | None:
    """Torch dims -> jax axes; None or [] means all (0-dim tensors accept dim 0 / -1)."""
    if dim is None:
        return None
    dims = [dim] if isinstance(dim, int) else list(dim)
    if not dims:
        return None
    if x.ndim == 0:
        return ()
    return tuple(sorted({d % x.ndim for d in dims}))


def _acc_dtype(x: jax.Array, dtype: torch.dtype | None) -> object:
    if dtype is not None:
        return jax_dtype(dtype)
    if x.dtype == jnp.bool_ or jnp.issubdtype(x.dtype, jnp.integer):
        return jnp.int64
    return x.dtype


@register(aten.sum.dim_IntList, aten.sum.default)
def _sum(x: jax.Array, dim: object = None, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> jax.Array:
    out_dtype = _acc_dtype(x, dtype)
    acc = jnp.float32 if out_dtype in _HALF else out_dtype
    return jnp.sum(x.astype(acc), axis=_axes(x, dim), keepdims=keepdim).astype(out_dtype)


@register(aten.mean.dim, aten.mean.default)
def _mean(x: jax.Array, dim: object = None, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> jax.Array:
    out_dtype = jax_dtype(dtype) if dtype is not None else x.dtype
    acc = jnp.float32 if out_dtype in _HALF else out_dtype
    return jnp.mean(x.astype(acc), axis=_axes(x, dim), keepdims=keepdim).astype(out_dtype)


@register(aten.prod.default, aten.prod.dim_int)
def _prod(x: jax.Array, dim: object = None, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> jax.Array:
    return jnp.prod(x.astype(_acc_dtype(x, dtype)), axis=_axes(x, dim), keepdims=keepdim)


@register(aten.amax.default)
def _amax(x: jax.Array, dim: Sequence[int] = (), keepdim: bool = False) -> jax.Array:
    return jnp.max(x, axis=_axes(x, dim), keepdims=keepdim)


@register(aten.amin.default)
def _amin(x: jax.Array, dim: Sequence[int] = (), keepdim: bool = False) -> jax.Array:
    return jnp.min(x, axis=_axes(x, dim), keepdims=keepdim)


@register(aten.any.default, aten.any.dim, aten.any.dims)
def _any(x: jax.Array, dim: object = None, keepdim: bool = False) -> jax.Array:
    return jnp.any(x, axis=_axes(x, dim), keepdims=keepdim)


@register(aten.all.default, aten.all.dim, aten.all.dims)
def _all(x: jax.Array, dim: object = None, keepdim: bool = False) -> jax.Array:
    return jnp.all(x, axis=_axes(x, dim), keepdims=keepdim)


def _arg(fn: object, x: jax.Array, dim: int | None, keepdim: bool) -> jax.Array:
    if dim is None:
        out = fn(x.reshape(-1))
        return out.reshape((1,) * x.ndim) if keepdim else out.astype(jnp.int64)
    if x.ndim == 0:
        return jnp.zeros((), jnp.int64)
    return fn(x, axis=dim, keepdims=keepdim).astype(jnp.int64)


@register(aten.argmax.default)
def _argmax(x: jax.Array, dim: int | None = None, keepdim: bool = False) -> jax.Array:
    return _arg(jnp.argmax, x, dim, keepdim).astype(jnp.int64)


@register(aten.argmin.default)
def _argmin(x: jax.Array, dim: int | None = None, keepdim: bool = False) -> jax.Array:
    return _arg(jnp.argmin, x, dim, keepdim).astype(jnp.int64)


@register(aten.max.dim)
def _max_dim(x: jax.Array, dim: int, keepdim: bool = False) -> tuple[jax.Array, jax.Array]:
    return _amax(x, [dim], keepdim), _argmax(x, dim, keepdim)


@register(aten.min.dim)
def _min_dim(x: jax.Array, dim: int, keepdim: bool = False) -> tuple[jax.Array, jax.Array]:
    return _amin(x, [dim], keepdim), _argmin(x, dim, keepdim)


@register(aten.max.default)
def _max(x: jax.Array) -> jax.Array:
    return jnp.max(x)


@register(aten.min.default)
def _min(x: jax.Array) -> jax.Array:
    return jnp.min(x)


@register(aten.var.correction, aten.var.dim)
def _var(x: jax.Array, dim: object = None, *args: object, correction: float | None = None,
         keepdim: bool = False) -> jax.Array:
    if args:                                     # var.dim(self, dim, unbiased, keepdim)
        correction = 1 if args[0] else 0
        keepdim = bool(args[1]) if len(args) > 1 else keepdim
    ddof = 1 if correction is None else correction
    acc = jnp.float32 if x.dtype in _HALF else x.dtype
    return jnp.var(x.astype(acc), axis=_axes(x, dim), ddof=ddof, keepdims=keepdim).astype(x.dtype)


@register(aten.var_mean.correction)
def _var_mean(x: jax.Array, dim: object = None, *, correction: float | None = None,
              keepdim: bool = False) -> tuple[jax.Array, jax.Array]:
    return _var(x, dim, correction=correction, keepdim=keepdim), _mean(x, dim, keepdim)


@register(aten.std.correction)
def _std(x: jax.Array, dim: object = None, *, correction: float | None = None, keepdim: bool = False) -> jax.Array:
    return jnp.sqrt(_var(x, dim, correction=correction, keepdim=keepdim))


@register(aten.logsumexp.default)
def _logsumexp(x: jax.Array, dim: Sequence[int], keepdim: bool = False) -> jax.Array:
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        x = x.astype(jnp.float32)
    return jax.scipy.special.logsumexp(x, axis=_axes(x, dim), keepdims=keepdim)


@register(aten.linalg_vector_norm.default)
def vector_norm(x: jax.Array, ord: float = 2, dim: object = None, keepdim: bool = False,  # noqa: A002
                 *, dtype: torch.dtype | None = None) -> jax.Array:
    if dtype is not None:
        x = x.astype(jax_dtype(dtype))
    axes = _axes(x, dim)
    a = jnp.abs(x)
    if ord == float("inf"):
        return jnp.max(a, axis=axes, keepdims=keepdim)
    if ord == float("-inf"):
        return jnp.min(a, axis=axes, keepdims=keepdim)
    if ord == 0:
        return jnp.sum(a != 0, axis=axes, keepdims=keepdim).astype(a.dtype)
    return jnp.sum(a ** ord, axis=axes, keepdims=keepdim) ** (1.0 / ord)


def _scan_dtype(x: jax.Array, dtype: torch.dtype | None) -> object:
    return _acc_dtype(x, dtype)


@register(aten.cumsum.default)
def _cumsum(x: jax.Array, dim: int, *, dtype: torch.dtype | None = None) -> jax.Array:
    x = x.astype(_scan_dtype(x, dtype))
    return x if x.ndim == 0 else jnp.cumsum(x, axis=dim)


@register(aten.cumprod.default)
def _cumprod(x: jax.Array, dim: int, *, dtype: torch.dtype | None = None) -> jax.Array:
    x = x.astype(_scan_dtype(x, dtype))
    return x if x.ndim == 0 else jnp.cumprod(x, axis=dim)


def _cum_extreme(x: jax.Array, dim: int, op: object) -> tuple[jax.Array, jax.Array]:
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    idx = lax.broadcasted_iota(jnp.int64, x.shape, dim % x.ndim)

    def combine(a: tuple, b: tuple) -> tuple:
        take_b = op(b[0], a[0]) | ((b[0] == a[0]) & (b[1] >= a[1])) | jnp.isnan(b[0])
        take_b = take_b & ~(jnp.isnan(a[0]) & ~jnp.isnan(b[0]))
        return jnp.where(take_b, b[0], a[0]), jnp.where(take_b, b[1], a[1])

    return lax.associative_scan(combine, (x, idx), axis=dim % x.ndim)


@register(aten.cummax.default)
def _cummax(x: jax.Array, dim: int) -> tuple[jax.Array, jax.Array]:
    return _cum_extreme(x, dim, jnp.greater)


@register(aten.cummin.default)
def _cummin(x: jax.Array, dim: int) -> tuple[jax.Array, jax.Array]:
    return _cum_extreme(x, dim, jnp.less)


@register(aten.sort.default, aten.sort.stable)
def _sort(x: jax.Array, *args: object, dim: int = -1, descending: bool = False,
          stable: bool | None = None) -> tuple[jax.Array, jax.Array]:
    if args:                                     # sort.default(self, dim, descending)
        dim = args[0]
        descending = bool(args[1]) if len(args) > 1 else descending
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    dim %= x.ndim
    idx = lax.broadcasted_iota(jnp.int64, x.shape, dim)
    if not descending:
        key = x
    elif jnp.issubdtype(x.dtype, jnp.floating):
        key = jnp.where(jnp.isnan(x), jnp.asarray(-jnp.inf, x.dtype), -x)   # NaN is the largest value
    else:
        key = ~x                                                          # order-reversing, no overflow
    _, out_idx = lax.sort((key, idx), dimension=dim, num_keys=1, is_stable=True)
    return jnp.take_along_axis(x, out_idx, axis=dim), out_idx


@register(aten.argsort.default, aten.argsort.stable)
def _argsort(x: jax.Array, *args: object, dim: int = -1, descending: bool = False,
             stable: bool = False) -> jax.Array:
    if args:
        dim = args[0]
        descending = bool(args[1]) if len(args) > 1 else descending
    return _sort(x, dim=dim, descending=descending)[1]


@register(aten.topk.default)
def _topk(x: jax.Array, k: int, dim: int = -1, largest: bool = True,
          sorted: bool = True) -> tuple[jax.Array, jax.Array]:  # noqa: A002
    values, idx = _sort(x, dim=dim, descending=largest)
    if x.ndim == 0:
        return values, idx
    dim %= x.ndim
    return lax.slice_in_dim(values, 0, k, axis=dim), lax.slice_in_dim(idx, 0, k, axis=dim)


@register(aten.logcumsumexp.default)
def _logcumsumexp(x: jax.Array, dim: int) -> jax.Array:
    return x if x.ndim == 0 else lax.cumlogsumexp(x, axis=dim % x.ndim)


def _lower_median(x: jax.Array, dim: int, keepdim: bool, nan: bool) -> tuple[jax.Array, jax.Array]:
    """Torch's median is the lower of the two middle values; NaN propagates unless ``nan`` (nanmedian)."""
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    dim %= x.ndim
    values, idx = _sort(x, dim=dim)
    n = x.shape[dim]
    if nan:
        count = jnp.sum(~jnp.isnan(x), axis=dim, keepdims=True)
        k = jnp.maximum((count - 1) // 2, 0)
    else:
        k = jnp.full(values.shape[:dim] + (1,) + values.shape[dim + 1:], (n - 1) // 2)
        has_nan = jnp.any(jnp.isnan(x), axis=dim, keepdims=True) if jnp.issubdtype(x.dtype, jnp.floating) else None
        if has_nan is not None:
            k = jnp.where(has_nan, n - 1, k)          # NaN sorts last: pick it
    v = jnp.take_along_axis(values, k, axis=dim)
    i = jnp.take_along_axis(idx, k, axis=dim)
    return (v, i) if keepdim else (v.squeeze(dim), i.squeeze(dim))


@register(aten.median.dim)
def _median_dim(x: jax.Array, dim: int, keepdim: bool = False) -> tuple[jax.Array, jax.Array]:
    return _lower_median(x, dim, keepdim, False)


@register(aten.nanmedian.dim)
def _nanmedian_dim(x: jax.Array, dim: int, keepdim: bool = False) -> tuple[jax.Array, jax.Array]:
    return _lower_median(x, dim, keepdim, True)


@register(aten.median.default)
def _median(x: jax.Array) -> jax.Array:
    return _lower_median(x.reshape(-1), 0, False, False)[0]


@register(aten.nanmedian.default)
def _nanmedian(x: jax.Array) -> jax.Array:
    return _lower_median(x.reshape(-1), 0, False, True)[0]


@register(aten.kthvalue.default)
def _kthvalue(x: jax.Array, k: int, dim: int = -1, keepdim: bool = False) -> tuple[jax.Array, jax.Array]:
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    dim %= x.ndim
    values, idx = _sort(x, dim=dim)
    v = lax.index_in_dim(values, k - 1, axis=dim, keepdims=keepdim)
    i = lax.index_in_dim(idx, k - 1, axis=dim, keepdims=keepdim)
    return v, i
