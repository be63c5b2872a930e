"""Contractions: mm, bmm, addmm, the int8/fp8 matmuls, baddbmm, dot, convolution and its backward (the MXU's work).

Float32 matmuls run at the precision PyTorch was asked for: ``torch.get_float32_matmul_precision()``
"highest" (PyTorch's default) -> ``lax.Precision.HIGHEST`` (exact float32 on a TPU, 6 bf16 passes),
"high"/"medium" -> XLA's default (bf16 passes on a TPU). On CPU both are exact float32.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import torch
from jax import lax

from tpusim.backend.lowering.dtypes import Kind, promote
from tpusim.backend.lowering.registry import register

aten = torch.ops.aten


def precision() -> lax.Precision | None:
    return lax.Precision.HIGHEST if torch.get_float32_matmul_precision() == "highest" else None


def _matmul(a: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.matmul(a, b, precision=precision())


@register(aten.mm.default, aten.bmm.default, aten.matmul.default, aten.mv.default)
def _mm(a: jax.Array, b: jax.Array) -> jax.Array:
    return _matmul(a, b)


@register(aten.dot.default, aten.vdot.default)
def _dot(a: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.dot(a, b, precision=precision())


def _scaled_add(c: jax.Array, ab: jax.Array, beta: object, alpha: object) -> jax.Array:
    if alpha != 1:
        ab = ab * jnp.asarray(alpha, ab.dtype)
    if beta == 0:
        return jnp.broadcast_to(ab, jnp.broadcast_shapes(ab.shape, c.shape)).astype(ab.dtype)
    if beta != 1:
        c = c * jnp.asarray(beta, c.dtype)
    _, res = promote(c, ab, kind=Kind.NO_OPMATH)
    return (c + ab).astype(res)


@register(aten.addmm.default, aten.baddbmm.default, aten.addmv.default)
def _addmm(c: jax.Array, a: jax.Array, b: jax.Array, *, beta: object = 1, alpha: object = 1) -> jax.Array:
    return _scaled_add(c, _matmul(a, b), beta, alpha)


@register(aten._addmm_activation.default)
def _addmm_activation(c: jax.Array, a: jax.Array, b: jax.Array, *, beta: object = 1, alpha: object = 1,
                      use_gelu: bool = False) -> jax.Array:
    out = _addmm(c, a, b, beta=beta, alpha=alpha)
    return jax.nn.gelu(out, approximate=False) if use_gelu else jnp.maximum(out, 0)


@register(aten._int_mm.default)
def _int_mm(a: jax.Array, b: jax.Array) -> jax.Array:
    """int8 x int8 -> int32, accumulated in int32 as the MXU does (exact: no float rounding)."""
    return lax.dot(a, b, preferred_element_type=jnp.int32)


@register(aten._weight_int8pack_mm.default)
def _weight_int8pack_mm(x: jax.Array, w: jax.Array, scales: jax.Array) -> jax.Array:
    """x [m, k] @ int8 weights stored [n, k], times per-output-channel scales: PyTorch's CPU kernel converts
    the weights to x's dtype and multiplies in it."""
    return (jnp.matmul(x, w.astype(x.dtype).T, precision=precision()) * scales.astype(x.dtype)).astype(x.dtype)


@register(aten._scaled_mm.default)
def _scaled_mm(a: jax.Array, b: jax.Array, scale_a: jax.Array, scale_b: jax.Array, bias: jax.Array | None = None,
               scale_result: jax.Array | None = None, out_dtype: object = None, use_fast_accum: bool = False
               ) -> jax.Array:
    """fp8 x fp8 with per-tensor or per-row scales, accumulated in float32, then scaled (and biased) in float32."""
    from tpusim.backend.lowering.dtypes import jax_dtype

    out = lax.dot(a, b, preferred_element_type=jnp.float32) * scale_a.astype(jnp.float32) * \
        scale_b.astype(jnp.float32)
    if bias is not None:
        out = out + bias.astype(jnp.float32)
    return out.astype(jax_dtype(out_dtype) if out_dtype is not None else a.dtype)


def _dim_numbers(nd: int) -> lax.ConvDimensionNumbers:
    sp = "DHW"[-nd:]
    shape = (1,) * (nd + 2)
    return lax.conv_dimension_numbers(shape, shape, ("NC" + sp, "OI" + sp, "NC" + sp))


@register(aten.convolution.default)
def _convolution(x: jax.Array, w: jax.Array, bias: jax.Array | None, stride: Sequence[int],
                 padding: Sequence[int], dilation: Sequence[int], transposed: bool,
                 output_padding: Sequence[int], groups: int) -> jax.Array:
    nd = x.ndim - 2
    batched = nd >= 1
    if not batched:
        raise NotImplementedError("convolution needs at least one spatial dim")
    stride, padding, dilation = (list(v) * nd if len(v) == 1 else list(v) for v in (stride, padding, dilation))
    dn = _dim_numbers(nd)
    if not transposed:
        out = lax.conv_general_dilated(x, w, stride, [(p, p) for p in padding], rhs_dilation=dilation,
                                       dimension_numbers=dn, feature_group_count=groups, precision=precision())
    else:
        # a transposed conv is the gradient of a conv: dilate the input by stride, flip the kernel,
        # swap its in/out channels (per group), pad by dilation*(k-1)-padding (+output_padding at the end)
        output_padding = list(output_padding) * nd if len(output_padding) == 1 else list(output_padding)
        cin, cout_g = w.shape[0], w.shape[1]
        k = w.shape[2:]
        wt = w.reshape(groups, cin // groups, cout_g, *k).swapaxes(1, 2).reshape(groups * cout_g, cin // groups, *k)
        wt = jnp.flip(wt, axis=tuple(range(2, 2 + nd)))
        pads = [(dilation[i] * (k[i] - 1) - padding[i], dilation[i] * (k[i] - 1) - padding[i] + output_padding[i])
                for i in range(nd)]
        out = lax.conv_general_dilated(x, wt, [1] * nd, pads, lhs_dilation=stride, rhs_dilation=dilation,
                                       dimension_numbers=dn, feature_group_count=groups, precision=precision())
    if bias is not None:
        out = out + bias.reshape((1, -1) + (1,) * nd).astype(out.dtype)
    return out


@register(aten.convolution_backward.default)
def _convolution_backward(grad: jax.Array, x: jax.Array, w: jax.Array, bias_sizes: object,
                          stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int],
                          transposed: bool, output_padding: Sequence[int], groups: int,
                          output_mask: Sequence[bool]) -> tuple:
    """The vjp of the forward lowering: what XLA's autodiff emits for a conv (two convs)."""
    def fwd(xx: jax.Array, ww: jax.Array) -> jax.Array:
        return _convolution(xx, ww, None, stride, padding, dilation, transposed, output_padding, groups)

    _, vjp = jax.vjp(fwd, x, w)
    gx, gw = vjp(grad)
    gb = jnp.sum(grad, axis=(0, *range(2, grad.ndim))) if output_mask[2] else None
    return (gx if output_mask[0] else None, gw if output_mask[1] else None, gb)


@register(aten.addbmm.default)
def _addbmm(c: jax.Array, a: jax.Array, b: jax.Array, *, beta: object = 1, alpha: object = 1) -> jax.Array:
    return _scaled_add(c, jnp.sum(_matmul(a, b), axis=0), beta, alpha)
