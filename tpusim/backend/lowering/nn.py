"""Neural-network ops: softmax, normalisations, pooling, upsampling, losses, distances, FFT.

Backward ops are the ``jax.vjp`` of the forward lowering where PyTorch keeps them as single ops
(layer/group norm backward, pooling backward): the same math XLA's autodiff emits, and one
definition to keep right. Normalisations of half types compute in float32, like PyTorch's CPU
and CUDA kernels.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from tpusim.backend.aten import flash_attention  # noqa: F401  (defines torch.ops.tpusim.attention*)
from tpusim.backend.lowering.dtypes import jax_dtype
from tpusim.backend.lowering.matmul import precision
from tpusim.backend.lowering.registry import register

aten = torch.ops.aten
_HALF = (jnp.float16, jnp.bfloat16)


def _acc(x: jax.Array) -> jax.Array:
    return x.astype(jnp.float32) if x.dtype in _HALF else x


@register(aten._softmax.default)
def _softmax(x: jax.Array, dim: int, half_to_float: bool = False) -> jax.Array:
    out = jax.nn.softmax(_acc(x), axis=dim) if x.ndim else jnp.ones_like(_acc(x))
    return out if half_to_float else out.astype(x.dtype)


@register(aten._log_softmax.default)
def _log_softmax(x: jax.Array, dim: int, half_to_float: bool = False) -> jax.Array:
    out = jax.nn.log_softmax(_acc(x), axis=dim) if x.ndim else jnp.zeros_like(_acc(x))
    return out if half_to_float else out.astype(x.dtype)


@register(aten._softmax_backward_data.default)
def _softmax_backward(grad: jax.Array, out: jax.Array, dim: int, input_dtype: torch.dtype) -> jax.Array:
    g = grad * out
    return (g - out * jnp.sum(g, axis=dim, keepdims=True)).astype(jax_dtype(input_dtype))


@register(aten._log_softmax_backward_data.default)
def _log_softmax_backward(grad: jax.Array, out: jax.Array, dim: int, input_dtype: torch.dtype) -> jax.Array:
    return (grad - jnp.exp(out) * jnp.sum(grad, axis=dim, keepdims=True)).astype(jax_dtype(input_dtype))


@register(aten.native_layer_norm.default)
def _layer_norm(x: jax.Array, shape: Sequence[int], weight: jax.Array | None, bias: jax.Array | None,
                eps: float) -> tuple[jax.Array, jax.Array, jax.Array]:
    axes = tuple(range(x.ndim - len(shape), x.ndim))
    xf = _acc(x)
    mean = jnp.mean(xf, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), axis=axes, keepdims=True)
    rstd = lax.rsqrt(var + eps)
    out = (xf - mean) * rstd
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out.astype(x.dtype), mean, rstd


def _norm_backward(g: jax.Array, xhat: jax.Array, rstd: jax.Array, axes: tuple[int, ...]) -> jax.Array:
    """d/dx of (x - mean) * rstd given dL/dxhat = g, with the saved statistics (closed form)."""
    mg = jnp.mean(g, axis=axes, keepdims=True)
    mgx = jnp.mean(g * xhat, axis=axes, keepdims=True)
    return rstd * (g - mg - xhat * mgx)


@register(aten.native_layer_norm_backward.default)
def _layer_norm_backward(grad: jax.Array, x: jax.Array, shape: Sequence[int], mean: jax.Array, rstd: jax.Array,
                         weight: jax.Array | None, bias: jax.Array | None, mask: Sequence[bool]) -> tuple:
    axes = tuple(range(x.ndim - len(shape), x.ndim))
    batch = tuple(range(x.ndim - len(shape)))
    gf, xhat = _acc(grad), (_acc(x) - mean) * rstd
    g = gf * weight if weight is not None else gf
    gx = _norm_backward(g, xhat, rstd, axes).astype(x.dtype) if mask[0] else None
    gw = jnp.sum(gf * xhat, axis=batch).astype(weight.dtype) if mask[1] and weight is not None else None
    gb = jnp.sum(gf, axis=batch).astype(bias.dtype) if mask[2] and bias is not None else None
    return gx, gw, gb


@register(aten.native_group_norm.default)
def _group_norm(x: jax.Array, weight: jax.Array | None, bias: jax.Array | None, n: int, c: int, hw: int,
                group: int, eps: float) -> tuple[jax.Array, jax.Array, jax.Array]:
    xf = _acc(x).reshape(n, group, -1)
    mean = jnp.mean(xf, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True)
    rstd = lax.rsqrt(var + eps)
    out = ((xf - mean) * rstd).reshape(x.shape)
    bshape = (1, c) + (1,) * (x.ndim - 2)
    if weight is not None:
        out = out * weight.reshape(bshape)
    if bias is not None:
        out = out + bias.reshape(bshape)
    return out.astype(x.dtype), mean.reshape(n, group), rstd.reshape(n, group)


@register(aten.native_group_norm_backward.default)
def _group_norm_backward(grad: jax.Array, x: jax.Array, mean: jax.Array, rstd: jax.Array, weight: jax.Array | None,
                         n: int, c: int, hw: int, group: int, mask: Sequence[bool]) -> tuple:
    bshape = (1, c) + (1,) * (x.ndim - 2)
    gf = _acc(grad)
    xhat = ((_acc(x).reshape(n, group, -1) - mean[..., None]) * rstd[..., None]).reshape(x.shape)
    g = gf * weight.reshape(bshape) if weight is not None else gf
    gx = _norm_backward(g.reshape(n, group, -1), xhat.reshape(n, group, -1), rstd[..., None], (2,))
    red = (0, *range(2, x.ndim))
    return (gx.reshape(x.shape).astype(x.dtype) if mask[0] else None,
            jnp.sum(gf * xhat, axis=red).astype(weight.dtype) if mask[1] and weight is not None else None,
            jnp.sum(gf, axis=red).astype(x.dtype) if mask[2] else None)


def _bn_shape(x: jax.Array) -> tuple[int, ...]:
    return (1, x.shape[1]) + (1,) * (x.ndim - 2)


def _batch_norm(x: jax.Array, weight: jax.Array | None, bias: jax.Array | None, mean: jax.Array,
                rstd: jax.Array) -> jax.Array:
    s = _bn_shape(x)
    out = (_acc(x) - mean.reshape(s)) * rstd.reshape(s)
    if weight is not None:
        out = out * weight.reshape(s)
    if bias is not None:
        out = out + bias.reshape(s)
    return out.astype(x.dtype)


def _batch_stats(x: jax.Array, eps: float) -> tuple[jax.Array, jax.Array, jax.Array]:
    axes = (0, *range(2, x.ndim))
    xf = _acc(x)
    mean = jnp.mean(xf, axis=axes)
    var = jnp.var(xf, axis=axes)
    return mean, var, lax.rsqrt(var + eps)


@register(aten._native_batch_norm_legit_functional.default)
def _bn_functional(x: jax.Array, weight: jax.Array | None, bias: jax.Array | None, running_mean: jax.Array,
                   running_var: jax.Array, training: bool, momentum: float, eps: float) -> tuple:
    if not training:
        rstd = lax.rsqrt(running_var + eps)
        return (_batch_norm(x, weight, bias, running_mean, rstd), jnp.zeros((0,), x.dtype),
                jnp.zeros((0,), x.dtype), running_mean, running_var)
    mean, var, rstd = _batch_stats(x, eps)
    n = x.size // x.shape[1]
    new_mean = running_mean * (1 - momentum) + mean.astype(running_mean.dtype) * momentum
    new_var = running_var * (1 - momentum) + (var * n / max(n - 1, 1)).astype(running_var.dtype) * momentum
    return _batch_norm(x, weight, bias, mean, rstd), mean, rstd, new_mean, new_var


@register(aten.native_batch_norm.default)
def _native_batch_norm(x: jax.Array, weight: jax.Array | None, bias: jax.Array | None,
                       running_mean: jax.Array | None, running_var: jax.Array | None, training: bool,
                       momentum: float, eps: float) -> tuple:
    """The running-statistics update is an unannotated mutation: graphs never rely on it (AOT autograd
    rewrites it to the _functional op) and eager PJRT runs that case on the host (pjrt.py)."""
    if not training:
        return _bn_no_training(x, weight, bias, running_mean, running_var, momentum, eps)
    return _bn_no_stats(x, weight, bias, training, momentum, eps)


@register(aten._batch_norm_with_update_functional.default)
def _bn_with_update(x: jax.Array, weight: jax.Array | None, bias: jax.Array | None, running_mean: jax.Array,
                    running_var: jax.Array, momentum: float, eps: float) -> tuple:
    out, mean, rstd, new_mean, new_var = _bn_functional(x, weight, bias, running_mean, running_var, True,
                                                        momentum, eps)
    return out, mean, rstd, jnp.zeros((0,), jnp.uint8), new_mean, new_var


@register(aten._native_batch_norm_legit.no_stats)
def _bn_no_stats(x: jax.Array, weight: jax.Array | None, bias: jax.Array | None, training: bool,
                 momentum: float, eps: float) -> tuple:
    mean, _, rstd = _batch_stats(x, eps)
    return _batch_norm(x, weight, bias, mean, rstd), mean, rstd


@register(aten._native_batch_norm_legit.default)
def _bn_legit(x: jax.Array, weight: jax.Array | None, bias: jax.Array | None, running_mean: jax.Array,
              running_var: jax.Array, training: bool, momentum: float, eps: float) -> tuple:
    """The running statistics update is a mutation; compiled graphs see the _functional op instead."""
    return _bn_functional(x, weight, bias, running_mean, running_var, training, momentum, eps)[:3]


@register(aten._native_batch_norm_legit_no_training.default)
def _bn_no_training(x: jax.Array, weight: jax.Array | None, bias: jax.Array | None, running_mean: jax.Array,
                    running_var: jax.Array, momentum: float, eps: float) -> tuple:
    rstd = lax.rsqrt(running_var + eps)
    return _batch_norm(x, weight, bias, running_mean, rstd), jnp.zeros((0,), x.dtype), jnp.zeros((0,), x.dtype)


@register(aten.native_batch_norm_backward.default)
def _bn_backward(grad: jax.Array, x: jax.Array, weight: jax.Array | None, running_mean: jax.Array | None,
                 running_var: jax.Array | None, save_mean: jax.Array | None, save_rstd: jax.Array | None,
                 train: bool, eps: float, mask: Sequence[bool]) -> tuple:
    def fwd(xx: jax.Array, w: jax.Array | None) -> jax.Array:
        if train:
            mean, _, rstd = _batch_stats(xx, eps)
        else:
            mean, rstd = running_mean, lax.rsqrt(running_var + eps)
        return _batch_norm(xx, w, None, mean, rstd)

    _, vjp = jax.vjp(fwd, x, weight)
    gx, gw = vjp(grad)
    gb = jnp.sum(grad, axis=(0, *range(2, grad.ndim)))
    return gx if mask[0] else None, gw if mask[1] and weight is not None else None, gb if mask[2] else None


# ---------------------------------------------------------------- pooling


def _tuple(v: object, nd: int, default: Sequence[int] | None = None) -> list[int]:
    if v is None or (isinstance(v, Sequence) and len(v) == 0):
        v = default
    v = list(v) if isinstance(v, Sequence) else [v]
    return v * nd if len(v) == 1 else v


def _pool_geometry(x: jax.Array, nd: int, kernel: Sequence[int], stride: Sequence[int], padding: Sequence[int],
                   dilation: Sequence[int], ceil_mode: bool) -> tuple[list, list, list, list]:
    k = _tuple(kernel, nd)
    s = _tuple(stride, nd, k)
    p = _tuple(padding, nd, [0])
    d = _tuple(dilation, nd, [1])
    pads, outs = [], []
    for i in range(nd):
        size = x.shape[x.ndim - nd + i]
        span = size + 2 * p[i] - d[i] * (k[i] - 1) - 1
        o = (-(-span // s[i]) if ceil_mode else span // s[i]) + 1
        if ceil_mode and (o - 1) * s[i] >= size + p[i]:
            o -= 1
        hi = (o - 1) * s[i] + d[i] * (k[i] - 1) + 1 - size - p[i]
        pads.append((p[i], max(hi, 0)))
        outs.append(o)
    return k, s, d, pads


def _window(x: jax.Array, nd: int, vals: list) -> tuple:
    lead = x.ndim - nd
    return (1,) * lead + tuple(vals)


def _max_pool(x: jax.Array, nd: int, kernel: Sequence[int], stride: Sequence[int], padding: Sequence[int],
              dilation: Sequence[int], ceil_mode: bool) -> tuple[jax.Array, jax.Array]:
    k, s, d, pads = _pool_geometry(x, nd, kernel, stride, padding, dilation, ceil_mode)
    lead = x.ndim - nd
    spatial = x.shape[lead:]
    flat = lax.broadcasted_iota(jnp.int64, spatial, 0) * 0
    for i in range(nd):
        flat = flat * spatial[i] + lax.broadcasted_iota(jnp.int64, spatial, i)
    idx = jnp.broadcast_to(flat, x.shape)
    low = jnp.array(-jnp.inf, x.dtype) if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo(x.dtype).min

    def pick(a: tuple, b: tuple) -> tuple:
        take_b = (b[0] > a[0]) | jnp.isnan(b[0]) & ~jnp.isnan(a[0]) | ((b[0] == a[0]) & (b[1] < a[1]))
        return jnp.where(take_b, b[0], a[0]), jnp.where(take_b, b[1], a[1])

    vals, inds = lax.reduce_window((x, idx), (jnp.asarray(low, x.dtype), jnp.asarray(-1, jnp.int64)), pick,
                                   _window(x, nd, k), _window(x, nd, s), [(0, 0)] * lead + pads,
                                   window_dilation=_window(x, nd, d))
    return vals, inds


@register(aten.max_pool2d_with_indices.default)
def _max_pool2d(x: jax.Array, kernel: Sequence[int], stride: Sequence[int] = (), padding: Sequence[int] = (0,),
                dilation: Sequence[int] = (1,), ceil_mode: bool = False) -> tuple[jax.Array, jax.Array]:
    return _max_pool(x, 2, kernel, stride, padding, dilation, ceil_mode)


@register(aten.max_pool3d_with_indices.default)
def _max_pool3d(x: jax.Array, kernel: Sequence[int], stride: Sequence[int] = (), padding: Sequence[int] = (0,),
                dilation: Sequence[int] = (1,), ceil_mode: bool = False) -> tuple[jax.Array, jax.Array]:
    return _max_pool(x, 3, kernel, stride, padding, dilation, ceil_mode)


def _max_pool_backward(grad: jax.Array, x: jax.Array, indices: jax.Array, nd: int) -> jax.Array:
    """Scatter-add each output gradient to the input position its max came from."""
    lead = x.shape[:x.ndim - nd]
    n_sp = int(np.prod(x.shape[x.ndim - nd:]))
    g = grad.reshape(int(np.prod(lead)) if lead else 1, -1)
    i = indices.reshape(g.shape)
    rows = lax.broadcasted_iota(jnp.int64, g.shape, 0)
    out = jnp.zeros((g.shape[0], n_sp), grad.dtype).at[rows, i].add(g)
    return out.reshape(x.shape)


@register(aten.max_pool2d_with_indices_backward.default)
def _max_pool2d_backward(grad: jax.Array, x: jax.Array, kernel: object, stride: object, padding: object,
                         dilation: object, ceil_mode: bool, indices: jax.Array) -> jax.Array:
    return _max_pool_backward(grad, x, indices, 2)


@register(aten.max_pool3d_with_indices_backward.default)
def _max_pool3d_backward(grad: jax.Array, x: jax.Array, kernel: object, stride: object, padding: object,
                         dilation: object, ceil_mode: bool, indices: jax.Array) -> jax.Array:
    return _max_pool_backward(grad, x, indices, 3)


def _avg_pool(x: jax.Array, nd: int, kernel: Sequence[int], stride: Sequence[int], padding: Sequence[int],
              ceil_mode: bool, count_include_pad: bool, divisor_override: int | None) -> jax.Array:
    k, s, d, pads = _pool_geometry(x, nd, kernel, stride, padding, [1], ceil_mode)
    lead = x.ndim - nd
    xf = _acc(x)
    full_pads = [(0, 0)] * lead + pads
    total = lax.reduce_window(xf, jnp.asarray(0, xf.dtype), lax.add, _window(x, nd, k), _window(x, nd, s), full_pads)
    if divisor_override:
        return (total / divisor_override).astype(x.dtype)
    spatial = x.shape[lead:]
    p = _tuple(padding, nd, [0])
    if count_include_pad:      # the window clipped to the explicitly padded input (not ceil_mode's extra)
        ones = jnp.pad(jnp.ones(spatial, xf.dtype), [(pi, pi) for pi in p], constant_values=1)
        extra = [(0, max(hi - pi, 0)) for (lo, hi), pi in zip(pads, p)]
    else:
        ones = jnp.ones(spatial, xf.dtype)
        extra = pads
    count = lax.reduce_window(ones, jnp.asarray(0, xf.dtype), lax.add, tuple(k), tuple(s), extra)
    return (total / count).astype(x.dtype)


@register(aten.avg_pool2d.default)
def _avg_pool2d(x: jax.Array, kernel: Sequence[int], stride: Sequence[int] = (), padding: Sequence[int] = (0,),
                ceil_mode: bool = False, count_include_pad: bool = True,
                divisor_override: int | None = None) -> jax.Array:
    return _avg_pool(x, 2, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)


@register(aten.avg_pool1d.default)
def _avg_pool1d(x: jax.Array, kernel: Sequence[int], stride: Sequence[int] = (), padding: Sequence[int] = (0,),
                ceil_mode: bool = False, count_include_pad: bool = True) -> jax.Array:
    return _avg_pool(x, 1, kernel, stride, padding, ceil_mode, count_include_pad, None)


@register(aten.avg_pool3d.default)
def _avg_pool3d(x: jax.Array, kernel: Sequence[int], stride: Sequence[int] = (), padding: Sequence[int] = (0,),
                ceil_mode: bool = False, count_include_pad: bool = True,
                divisor_override: int | None = None) -> jax.Array:
    return _avg_pool(x, 3, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)


@register(aten.avg_pool2d_backward.default)
def _avg_pool2d_backward(grad: jax.Array, x: jax.Array, kernel: Sequence[int], stride: Sequence[int],
                         padding: Sequence[int], ceil_mode: bool, count_include_pad: bool,
                         divisor_override: int | None) -> jax.Array:
    _, vjp = jax.vjp(lambda v: _avg_pool(v, 2, kernel, stride, padding, ceil_mode, count_include_pad,
                                         divisor_override), x)
    return vjp(grad)[0]


def _adaptive_matrix(size: int, out: int, dtype: object) -> np.ndarray:
    m = np.zeros((out, size))
    for i in range(out):
        lo, hi = (i * size) // out, -(-((i + 1) * size) // out)
        m[i, lo:hi] = 1.0 / (hi - lo)
    return m.astype(dtype)


def _adaptive_avg(x: jax.Array, output_size: Sequence[int]) -> jax.Array:
    nd = len(output_size)
    xf = _acc(x)
    for i, o in enumerate(output_size):
        axis = x.ndim - nd + i
        m = _adaptive_matrix(x.shape[axis], o, np.dtype(xf.dtype) if xf.dtype != jnp.bfloat16 else np.float32)
        xf = jnp.moveaxis(jnp.tensordot(xf, jnp.asarray(m, xf.dtype), axes=([axis], [1])), -1, axis)
    return xf.astype(x.dtype)


@register(aten._adaptive_avg_pool2d.default, aten._adaptive_avg_pool3d.default, aten.adaptive_avg_pool1d.default)
def _adaptive_avg_pool(x: jax.Array, output_size: Sequence[int]) -> jax.Array:
    return _adaptive_avg(x, output_size)


@register(aten._adaptive_avg_pool2d_backward.default, aten._adaptive_avg_pool3d_backward.default)
def _adaptive_avg_pool_backward(grad: jax.Array, x: jax.Array) -> jax.Array:
    nd = 2 if grad.ndim in (3, 4) and x.ndim in (3, 4) else 3
    _, vjp = jax.vjp(lambda v: _adaptive_avg(v, grad.shape[-nd:]), x)
    return vjp(grad)[0]


# ---------------------------------------------------------------- upsampling


def _scales(x: jax.Array, output_size: Sequence[int] | None, scale_factors: Sequence[float] | None,
            nd: int) -> tuple[list[int], list[float]]:
    ins = x.shape[-nd:]
    if output_size:
        outs = list(output_size)
        return outs, [i / o for i, o in zip(ins, outs)]
    outs = [int(math.floor(i * f)) for i, f in zip(ins, scale_factors)]
    return outs, [1.0 / f for f in scale_factors]


@register(aten.upsample_nearest2d.vec, aten.upsample_nearest1d.vec, aten.upsample_nearest3d.vec)
def _upsample_nearest(x: jax.Array, output_size: Sequence[int] | None,
                      scale_factors: Sequence[float] | None) -> jax.Array:
    nd = len(output_size) if output_size else len(scale_factors)
    outs, scales = _scales(x, output_size, scale_factors, nd)
    for i, (o, sc) in enumerate(zip(outs, scales)):
        axis = x.ndim - nd + i
        src = np.minimum(np.floor(np.arange(o) * np.float32(sc)).astype(np.int64), x.shape[axis] - 1)
        x = jnp.take(x, src, axis=axis)
    return x


@register(aten.upsample_nearest2d.default, aten.upsample_nearest1d.default, aten.upsample_nearest3d.default)
def _upsample_nearest_sizes(x: jax.Array, output_size: Sequence[int], *scales: float | None) -> jax.Array:
    nd = len(output_size)
    if scales and all(s is not None for s in scales[:nd]):
        return _nearest_with_scales(x, output_size, scales[:nd])
    return _upsample_nearest(x, output_size, None)


def _nearest_with_scales(x: jax.Array, output_size: Sequence[int], scales: Sequence[float]) -> jax.Array:
    nd = len(output_size)
    for i, (o, sf) in enumerate(zip(output_size, scales)):
        axis = x.ndim - nd + i
        src = np.minimum(np.floor(np.arange(o) * np.float32(1.0 / sf)).astype(np.int64), x.shape[axis] - 1)
        x = jnp.take(x, src, axis=axis)
    return x


@register(aten.upsample_bilinear2d.default, aten.upsample_linear1d.default, aten.upsample_trilinear3d.default)
def _upsample_linear_sizes(x: jax.Array, output_size: Sequence[int], align_corners: bool,
                           *scales: float | None) -> jax.Array:
    nd = len(output_size)
    if scales and all(s is not None for s in scales[:nd]) and not align_corners:
        xf = _acc(x)
        for i, (o, sf) in enumerate(zip(output_size, scales[:nd])):
            axis = x.ndim - nd + i
            m = jnp.asarray(_linear_matrix(x.shape[axis], o, 1.0 / sf, False), xf.dtype)
            xf = jnp.moveaxis(jnp.tensordot(xf, m, axes=([axis], [1]), precision=lax.Precision.HIGHEST), -1, axis)
        return xf.astype(x.dtype)
    return _upsample_linear(x, output_size, align_corners, None)


def _linear_matrix(size: int, out: int, scale: float, align_corners: bool) -> np.ndarray:
    m = np.zeros((out, size), np.float64)
    for o in range(out):
        if align_corners:
            src = o * (size - 1) / (out - 1) if out > 1 else 0.0
        else:
            src = max((o + 0.5) * scale - 0.5, 0.0)
        lo = min(int(math.floor(src)), size - 1)
        hi = min(lo + 1, size - 1)
        w = src - lo
        m[o, lo] += 1 - w
        m[o, hi] += w
    return m


@register(aten.upsample_bilinear2d.vec, aten.upsample_linear1d.vec, aten.upsample_trilinear3d.vec)
def _upsample_linear(x: jax.Array, output_size: Sequence[int] | None, align_corners: bool,
                     scale_factors: Sequence[float] | None) -> jax.Array:
    nd = len(output_size) if output_size else len(scale_factors)
    outs, scales = _scales(x, output_size, scale_factors, nd)
    xf = _acc(x)
    for i, (o, sc) in enumerate(zip(outs, scales)):
        axis = x.ndim - nd + i
        m = jnp.asarray(_linear_matrix(x.shape[axis], o, sc, align_corners), xf.dtype)
        xf = jnp.moveaxis(jnp.tensordot(xf, m, axes=([axis], [1]), precision=lax.Precision.HIGHEST), -1, axis)
    return xf.astype(x.dtype)


# ---------------------------------------------------------------- losses and distances


@register(aten.nll_loss_forward.default)
def _nll_loss(x: jax.Array, target: jax.Array, weight: jax.Array | None, reduction: int,
              ignore_index: int) -> tuple[jax.Array, jax.Array]:
    cls_axis = 1 if x.ndim > 1 else 0
    safe = jnp.where(target == ignore_index, 0, target)
    picked = jnp.take_along_axis(x, jnp.expand_dims(safe, cls_axis), axis=cls_axis).squeeze(cls_axis) \
        if x.ndim > 1 else x[safe]
    w = weight[safe] if weight is not None else jnp.ones(picked.shape, x.dtype)
    w = jnp.where(target == ignore_index, 0, w).astype(x.dtype)
    losses = -picked * w
    if reduction == 0:
        return losses, jnp.zeros((), x.dtype)
    total = jnp.sum(w)
    if reduction == 1:
        return jnp.sum(losses) / total, total
    return jnp.sum(losses), total


@register(aten.nll_loss_backward.default)
def _nll_loss_backward(grad: jax.Array, x: jax.Array, target: jax.Array, weight: jax.Array | None, reduction: int,
                       ignore_index: int, total_weight: jax.Array) -> jax.Array:
    _, vjp = jax.vjp(lambda v: _nll_loss(v, target, weight, reduction, ignore_index)[0], x)
    return vjp(grad)[0]


@register(aten._cdist_forward.default)
def _cdist(x1: jax.Array, x2: jax.Array, p: float, compute_mode: int | None) -> jax.Array:
    diff = jnp.abs(x1[..., :, None, :] - x2[..., None, :, :])
    if p == 0:
        return jnp.sum(diff != 0, axis=-1).astype(x1.dtype)
    if p == float("inf"):
        return jnp.max(diff, axis=-1)
    if p == 2:
        return jnp.sqrt(jnp.sum(diff * diff, axis=-1))
    return jnp.sum(diff ** p, axis=-1) ** (1.0 / p)


@register(aten._pdist_forward.default)
def _pdist(x: jax.Array, p: float = 2) -> jax.Array:
    rows, cols = np.triu_indices(x.shape[0], 1)
    return _cdist(x[None], x[None], p, None)[0][rows, cols]


# ---------------------------------------------------------------- FFT


def _fft_scale(x: jax.Array, dims: Sequence[int], normalization: int, sizes: Sequence[int] | None = None) -> float:
    n = int(np.prod(sizes if sizes is not None else [x.shape[d] for d in dims]))
    return {0: 1.0, 1: 1.0 / math.sqrt(n), 2: 1.0 / n}[normalization]


@register(aten._fft_r2c.default)
def _fft_r2c(x: jax.Array, dim: Sequence[int], normalization: int, onesided: bool) -> jax.Array:
    dims = [d % x.ndim for d in dim]
    out = jnp.fft.rfftn(x, axes=dims) if onesided else jnp.fft.fftn(x, axes=dims)
    return (out * _fft_scale(x, dims, normalization)).astype(jnp.complex128 if x.dtype == jnp.float64
                                                              else jnp.complex64)


@register(aten._fft_c2c.default)
def _fft_c2c(x: jax.Array, dim: Sequence[int], normalization: int, forward: bool) -> jax.Array:
    dims = [d % x.ndim for d in dim]
    out = jnp.fft.fftn(x, axes=dims) if forward else jnp.fft.ifftn(x, axes=dims, norm="forward")
    return (out * _fft_scale(x, dims, normalization)).astype(x.dtype)


@register(aten._fft_c2r.default)
def _fft_c2r(x: jax.Array, dim: Sequence[int], normalization: int, last_dim_size: int) -> jax.Array:
    dims = [d % x.ndim for d in dim]
    sizes = [x.shape[d] for d in dims[:-1]] + [last_dim_size]
    out = jnp.fft.irfftn(x, s=sizes, axes=dims, norm="forward")
    return (out * _fft_scale(x, dims, normalization, sizes)).astype(
        jnp.float64 if x.dtype == jnp.complex128 else jnp.float32)


# ---------------------------------------------------------------- attention


def _attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array | None, causal: bool,
               scale: float | None) -> jax.Array:
    s = jnp.matmul(q, jnp.swapaxes(k, -1, -2), precision=precision()) * (scale or 1.0 / math.sqrt(q.shape[-1]))
    if causal:
        s = jnp.where(jnp.tril(jnp.ones((q.shape[-2], k.shape[-2]), jnp.bool_)), s, -jnp.inf)
    if mask is not None:
        s = jnp.where(mask, s, -jnp.inf) if mask.dtype == jnp.bool_ else s + mask
    return jnp.matmul(jax.nn.softmax(s, axis=-1), v, precision=precision())


def _masked_scores(q: jax.Array, k: jax.Array, mask: jax.Array | None, causal: bool, scale: float | None
                   ) -> jax.Array:
    s = jnp.matmul(q.astype(jnp.float32), jnp.swapaxes(k.astype(jnp.float32), -1, -2), precision=precision())
    s = s * (scale if scale is not None else 1.0 / math.sqrt(q.shape[-1]))
    if causal:
        s = jnp.where(jnp.tril(jnp.ones((q.shape[-2], k.shape[-2]), jnp.bool_)), s, -jnp.inf)
    if mask is not None:
        s = jnp.where(mask, s, -jnp.inf) if mask.dtype == jnp.bool_ else s + mask
    return s


def _grouped(q: jax.Array, kv: jax.Array) -> jax.Array:
    """K or V with each head repeated for its group of query heads (grouped-query attention)."""
    groups = q.shape[-3] // kv.shape[-3] if q.ndim >= 3 and kv.ndim >= 3 else 1
    return jnp.repeat(kv, groups, axis=-3) if groups > 1 else kv


def _summed(grad: jax.Array, kv: jax.Array) -> jax.Array:
    """A grouped gradient back to K's or V's heads: the sum over each group."""
    if grad.shape == kv.shape:
        return grad
    *lead, heads, t, d = grad.shape
    return grad.reshape(*lead, kv.shape[-3], heads // kv.shape[-3], t, d).sum(-3)


@register(torch.ops.tpusim.attention.default)
def _fused_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array | None, dropout_p: float,
                     causal: bool, scale: float | None) -> tuple[jax.Array, jax.Array]:
    """tpusim/backend/aten/flash_attention.py's fused attention: (output, log-sum-exp), scores in float32."""
    s = _masked_scores(q, _grouped(q, k), mask, causal, scale)
    out = jnp.matmul(jax.nn.softmax(s, axis=-1), _grouped(q, v).astype(jnp.float32), precision=precision())
    return out.astype(v.dtype), jax.nn.logsumexp(s, axis=-1)


@register(torch.ops.tpusim.attention_backward.default)
def _fused_attention_backward(grad: jax.Array, q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array | None,
                              out: jax.Array, lse: jax.Array, causal: bool, scale: float | None
                              ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Its backward from the log-sum-exp, the formulas of tpusim::attention_backward's eager kernel."""
    kg, vg = _grouped(q, k), _grouped(q, v)
    p = jnp.exp(_masked_scores(q, kg, mask, causal, scale) - lse[..., None])
    g = grad.astype(jnp.float32)
    dv = jnp.matmul(jnp.swapaxes(p, -1, -2), g, precision=precision())
    dp = jnp.matmul(g, jnp.swapaxes(vg.astype(jnp.float32), -1, -2), precision=precision())
    ds = p * (dp - jnp.sum(g * out.astype(jnp.float32), axis=-1, keepdims=True))
    ds = ds * (scale if scale is not None else 1.0 / math.sqrt(q.shape[-1]))
    dq = jnp.matmul(ds, kg.astype(jnp.float32), precision=precision())
    dk = jnp.matmul(jnp.swapaxes(ds, -1, -2), q.astype(jnp.float32), precision=precision())
    return dq.astype(q.dtype), _summed(dk, k).astype(k.dtype), _summed(dv, v).astype(v.dtype)


@register(aten._transformer_encoder_layer_fwd.default)
def _encoder_layer(src: jax.Array, embed_dim: int, num_heads: int, qkv_w: jax.Array, qkv_b: jax.Array,
                   proj_w: jax.Array, proj_b: jax.Array, use_gelu: bool, norm_first: bool, eps: float,
                   n1_w: jax.Array, n1_b: jax.Array, n2_w: jax.Array, n2_b: jax.Array, f1_w: jax.Array,
                   f1_b: jax.Array, f2_w: jax.Array, f2_b: jax.Array, mask: jax.Array | None = None,
                   mask_type: int | None = None) -> jax.Array:
    """nn.TransformerEncoderLayer's inference fast path (eval + no_grad), as its unfused math."""
    def linear(x: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
        return jnp.matmul(x, w.T, precision=precision()) + b

    def attn(x: jax.Array) -> jax.Array:
        *lead, s, d = x.shape
        qkv = linear(x, qkv_w, qkv_b).reshape(*lead, s, 3, num_heads, d // num_heads)
        q, k, v = (jnp.moveaxis(qkv[..., i, :, :], -2, -3) for i in range(3))
        m = None if mask is None else (~mask if mask.dtype == jnp.bool_ else mask)
        out = jnp.moveaxis(_attention(q, k, v, m, False, None), -3, -2).reshape(*lead, s, d)
        return linear(out, proj_w, proj_b)

    def ffn(x: jax.Array) -> jax.Array:
        h = linear(x, f1_w, f1_b)
        h = jax.nn.gelu(h, approximate=False) if use_gelu else jnp.maximum(h, 0)
        return linear(h, f2_w, f2_b)

    def ln(x: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
        return _layer_norm(x, [embed_dim], w, b, eps)[0]

    x = src
    if norm_first:
        x = x + attn(ln(x, n1_w, n1_b))
        return x + ffn(ln(x, n2_w, n2_b))
    x = ln(x + attn(x), n1_w, n1_b)
    return ln(x + ffn(x), n2_w, n2_b)
