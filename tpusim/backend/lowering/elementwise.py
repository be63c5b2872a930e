"""Elementwise ops: unary math, binary arithmetic, comparisons, activations.

Every op promotes like PyTorch (``dtypes.promote``): computes in the computation dtype (float32
for half types, the default float for "int -> float" ops) and casts to the result dtype;
broadcasting is jax's, which is PyTorch's (numpy rules).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import torch
from jax import lax

from tpusim.backend.lowering.dtypes import Kind, as_array, jax_dtype, promote
from tpusim.backend.lowering.reductions import vector_norm
from tpusim.backend.lowering.registry import register

aten = torch.ops.aten


def _elementwise(fn: Callable, kind: Kind, *args: object) -> jax.Array:
    comp, res = promote(*args, kind=kind)
    out = fn(*(as_array(a, comp) for a in args))
    return out.astype(res) if out.dtype != res else out


def _unary(fn: Callable, kind: Kind, *ops: object) -> None:
    register(*ops)(lambda x: _elementwise(fn, kind, x))


def _binary(fn: Callable, kind: Kind, *ops: object) -> None:
    register(*ops)(lambda x, y: _elementwise(fn, kind, x, y))


_F = Kind.INT_TO_FLOAT
for _op, _fn in {
    aten.sin: jnp.sin, aten.cos: jnp.cos, aten.tan: jnp.tan, aten.asin: jnp.arcsin, aten.acos: jnp.arccos,
    aten.atan: jnp.arctan, aten.sinh: jnp.sinh, aten.cosh: jnp.cosh, aten.tanh: jnp.tanh,
    aten.asinh: jnp.arcsinh, aten.acosh: jnp.arccosh, aten.atanh: jnp.arctanh, aten.exp: jnp.exp,
    aten.exp2: jnp.exp2, aten.expm1: jnp.expm1, aten.log: jnp.log, aten.log2: jnp.log2,
    aten.log10: jnp.log10, aten.log1p: jnp.log1p, aten.sqrt: jnp.sqrt, aten.rsqrt: lax.rsqrt,
    aten.erf: jax.scipy.special.erf, aten.erfc: jax.scipy.special.erfc, aten.erfinv: jax.scipy.special.erfinv,
    aten.sigmoid: jax.nn.sigmoid, aten.reciprocal: lambda x: 1 / x, aten.lgamma: jax.scipy.special.gammaln,
    aten.digamma: jax.scipy.special.digamma, aten.sinc: jnp.sinc, aten.deg2rad: jnp.deg2rad,
    aten.rad2deg: jnp.rad2deg, aten.i0: jax.scipy.special.i0,
}.items():
    _unary(_fn, _F, _op.default)

_unary(jnp.negative, Kind.DEFAULT, aten.neg.default)
_unary(jnp.sign, Kind.DEFAULT, aten.sign.default)
_unary(jnp.sign, Kind.DEFAULT, aten.sgn.default)
_unary(lambda x: jnp.maximum(x, 0).astype(x.dtype), Kind.DEFAULT, aten.relu.default)
_unary(jnp.abs, Kind.COMPLEX_TO_FLOAT, aten.abs.default)
_unary(jnp.invert, Kind.DEFAULT, aten.bitwise_not.default)
_unary(jnp.isnan, Kind.ALWAYS_BOOL, aten.isnan.default)
_unary(jnp.isinf, Kind.ALWAYS_BOOL, aten.isinf.default)
_unary(jnp.isfinite, Kind.ALWAYS_BOOL, aten.isfinite.default)
_unary(jnp.isposinf, Kind.ALWAYS_BOOL, aten.isposinf.default)
_unary(jnp.isneginf, Kind.ALWAYS_BOOL, aten.isneginf.default)
_unary(jnp.logical_not, Kind.ALWAYS_BOOL, aten.logical_not.default)
_unary(jnp.signbit, Kind.ALWAYS_BOOL, aten.signbit.default)


def _integral_identity(fn: Callable) -> Callable:
    """ceil/floor/trunc/round of an integer tensor is the tensor itself (and keeps its dtype)."""
    return lambda x: x if jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_ else fn(x)


for _op, _fn in {aten.ceil: jnp.ceil, aten.floor: jnp.floor, aten.trunc: jnp.trunc, aten.round: jnp.round,
                 aten.frac: lambda x: x - jnp.trunc(x)}.items():
    _unary(_integral_identity(_fn), Kind.DEFAULT, _op.default)


@register(aten.round.decimals)
def _round_decimals(x: jax.Array, *, decimals: int = 0) -> jax.Array:
    return _elementwise(lambda v: jnp.round(v, decimals), Kind.DEFAULT, x)


def _is_one(alpha: object) -> bool:
    """alpha == 1 without asking a traced value (the PJRT target passes Python floats as arguments)."""
    return isinstance(alpha, (int, float)) and alpha == 1


@register(aten.add.Tensor, aten.add.Scalar)
def _add(x: object, y: object, *, alpha: object = 1) -> jax.Array:
    if not _is_one(alpha):
        return _elementwise(lambda a, b: a + b * jnp.asarray(alpha, b.dtype), Kind.DEFAULT, x, y)
    return _elementwise(jnp.add, Kind.DEFAULT, x, y)


@register(aten.sub.Tensor, aten.sub.Scalar)
def _sub(x: object, y: object, *, alpha: object = 1) -> jax.Array:
    if not _is_one(alpha):
        return _elementwise(lambda a, b: a - b * jnp.asarray(alpha, b.dtype), Kind.DEFAULT, x, y)
    return _elementwise(jnp.subtract, Kind.DEFAULT, x, y)


@register(aten.rsub.Tensor, aten.rsub.Scalar)
def _rsub(x: object, y: object, *, alpha: object = 1) -> jax.Array:
    return _sub(y, x, alpha=alpha) if _is_one(alpha) else _elementwise(lambda a, b: b - a * alpha, Kind.DEFAULT, x, y)


_binary(jnp.multiply, Kind.DEFAULT, aten.mul.Tensor, aten.mul.Scalar)
_binary(jnp.maximum, Kind.DEFAULT, aten.maximum.default)
_binary(jnp.minimum, Kind.DEFAULT, aten.minimum.default)
_binary(jnp.fmax, Kind.DEFAULT, aten.fmax.default)
_binary(jnp.fmin, Kind.DEFAULT, aten.fmin.default)
_binary(jnp.arctan2, _F, aten.atan2.default)
register(aten.atan2.out)(lambda x, y, *, out=None: _elementwise(jnp.arctan2, _F, x, y))
_binary(jnp.hypot, Kind.DEFAULT, aten.hypot.default)
_binary(jnp.copysign, _F, aten.copysign.Tensor, aten.copysign.Scalar)
_binary(jnp.nextafter, Kind.NO_OPMATH, aten.nextafter.default)
_binary(jnp.fmod, Kind.DEFAULT, aten.fmod.Tensor, aten.fmod.Scalar)
_binary(jnp.remainder, Kind.DEFAULT, aten.remainder.Tensor, aten.remainder.Scalar)
_binary(jnp.bitwise_and, Kind.DEFAULT, aten.bitwise_and.Tensor, aten.bitwise_and.Scalar)
_binary(jnp.bitwise_or, Kind.DEFAULT, aten.bitwise_or.Tensor, aten.bitwise_or.Scalar)
_binary(jnp.bitwise_xor, Kind.DEFAULT, aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar)
_binary(jnp.left_shift, Kind.DEFAULT, aten.bitwise_left_shift.Tensor, aten.__lshift__.Tensor)
_binary(jnp.right_shift, Kind.DEFAULT, aten.bitwise_right_shift.Tensor, aten.__rshift__.Tensor)
_binary(jnp.logaddexp, Kind.INT_TO_FLOAT, aten.logaddexp.default)
_binary(lambda a, b: jax.scipy.special.xlogy(a, b), _F, aten.xlogy.Tensor)
_binary(jax.scipy.special.gammainc, _F, aten.igamma.default)
_binary(jax.scipy.special.gammaincc, _F, aten.igammac.default)
_binary(lambda a, b: a * jnp.exp2(b), _F, aten.ldexp.Tensor)
_binary(jnp.heaviside, Kind.DEFAULT, aten.heaviside.default)


@register(aten.polygamma.default)
def _polygamma(n: int, x: jax.Array) -> jax.Array:
    return _elementwise(lambda v: jax.scipy.special.polygamma(n, v), _F, x)
for _op, _fn in {aten.eq: jnp.equal, aten.ne: jnp.not_equal, aten.lt: jnp.less, aten.le: jnp.less_equal,
                 aten.gt: jnp.greater, aten.ge: jnp.greater_equal}.items():
    _binary(_fn, Kind.ALWAYS_BOOL, _op.Tensor, _op.Scalar)
for _op, _fn in {aten.logical_and: jnp.logical_and, aten.logical_or: jnp.logical_or,
                 aten.logical_xor: jnp.logical_xor}.items():
    register(_op.default)(lambda x, y, _fn=_fn: _fn(x, y))


@register(aten.div.Tensor, aten.div.Scalar)
def _div(x: object, y: object) -> jax.Array:
    return _elementwise(jnp.true_divide, _F, x, y)


@register(aten.div.Tensor_mode, aten.div.Scalar_mode)
def _div_mode(x: object, y: object, *, rounding_mode: str | None = None) -> jax.Array:
    if rounding_mode is None:
        return _div(x, y)

    def fn(a: jax.Array, b: jax.Array) -> jax.Array:
        integral = jnp.issubdtype(a.dtype, jnp.integer)
        if rounding_mode == "trunc":
            return lax.div(a, b) if integral else jnp.trunc(a / b)
        return jnp.floor_divide(a, b)

    return _elementwise(fn, Kind.DEFAULT, x, y)


_binary(jnp.floor_divide, Kind.DEFAULT, aten.floor_divide.default, aten.floor_divide.Scalar)


@register(aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar, aten.pow.Scalar)
def _pow(x: object, y: object) -> jax.Array:
    if isinstance(y, int | float) and not isinstance(y, bool) and y == 2:
        return _elementwise(jnp.square, Kind.BOOL_TO_LONG, x)
    return _elementwise(jnp.power, Kind.BOOL_TO_LONG, x, y)


@register(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _where(cond: jax.Array, x: object, y: object) -> jax.Array:
    _, res = promote(x, y, kind=Kind.NO_OPMATH)
    return jnp.where(cond, as_array(x, res), as_array(y, res))


@register(aten.clamp.default, aten.clamp.Tensor)
def _clamp(x: jax.Array, min: object = None, max: object = None) -> jax.Array:  # noqa: A002
    args = [a for a in (x, min, max) if a is not None]
    comp, res = promote(*args, kind=Kind.DEFAULT)
    out = as_array(x, comp)
    if min is not None:
        out = jnp.maximum(out, as_array(min, comp))
    if max is not None:
        out = jnp.minimum(out, as_array(max, comp))
    return out.astype(res)


@register(aten.clamp_min.default, aten.clamp_min.Tensor)
def _clamp_min(x: jax.Array, min: object) -> jax.Array:  # noqa: A002
    return _clamp(x, min, None)


@register(aten.clamp_max.default, aten.clamp_max.Tensor)
def _clamp_max(x: jax.Array, max: object) -> jax.Array:  # noqa: A002
    return _clamp(x, None, max)


@register(aten.hardtanh.default)
def _hardtanh(x: jax.Array, min_val: float = -1.0, max_val: float = 1.0) -> jax.Array:
    return jnp.clip(x, jnp.asarray(min_val, x.dtype), jnp.asarray(max_val, x.dtype))


@register(aten.leaky_relu.default)
def _leaky_relu(x: jax.Array, negative_slope: float = 0.01) -> jax.Array:
    return jnp.where(x > 0, x, x * jnp.asarray(negative_slope, x.dtype))


@register(aten.elu.default)
def _elu(x: jax.Array, alpha: float = 1.0, scale: float = 1.0, input_scale: float = 1.0) -> jax.Array:
    def fn(v: jax.Array) -> jax.Array:
        return jnp.where(v > 0, v * scale, jnp.expm1(v * input_scale) * alpha * scale)

    return _elementwise(fn, Kind.DEFAULT, x)


@register(aten.gelu.default)
def _gelu(x: jax.Array, *, approximate: str = "none") -> jax.Array:
    def fn(v: jax.Array) -> jax.Array:
        if approximate == "tanh":
            return 0.5 * v * (1 + jnp.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))
        return 0.5 * v * (1 + jax.scipy.special.erf(v / math.sqrt(2)))

    return _elementwise(fn, Kind.DEFAULT, x)


@register(aten.silu.default)
def _silu(x: jax.Array) -> jax.Array:
    return _elementwise(lambda v: v * jax.nn.sigmoid(v), Kind.DEFAULT, x)


@register(aten.lerp.Scalar, aten.lerp.Tensor)
def _lerp(x: jax.Array, end: jax.Array, weight: object) -> jax.Array:
    return _elementwise(lambda a, b, w: a + w * (b - a), Kind.DEFAULT, x, end, weight)


@register(aten.addcmul.default)
def _addcmul(x: jax.Array, t1: jax.Array, t2: jax.Array, *, value: object = 1) -> jax.Array:
    return _elementwise(lambda a, b, c: a + value * b * c, Kind.DEFAULT, x, t1, t2)


@register(aten.addcdiv.default)
def _addcdiv(x: jax.Array, t1: jax.Array, t2: jax.Array, *, value: object = 1) -> jax.Array:
    return _elementwise(lambda a, b, c: a + value * b / c, Kind.DEFAULT, x, t1, t2)


@register(aten.threshold_backward.default)
def _threshold_backward(grad: jax.Array, x: jax.Array, threshold: float) -> jax.Array:
    return jnp.where(x <= threshold, jnp.zeros((), grad.dtype), grad)


@register(aten.sigmoid_backward.default)
def _sigmoid_backward(grad: jax.Array, y: jax.Array) -> jax.Array:
    return _elementwise(lambda g, s: g * (1 - s) * s, Kind.DEFAULT, grad, y)


@register(aten.tanh_backward.default)
def _tanh_backward(grad: jax.Array, y: jax.Array) -> jax.Array:
    return _elementwise(lambda g, t: g * (1 - t * t), Kind.DEFAULT, grad, y)


@register(aten.gelu_backward.default)
def _gelu_backward(grad: jax.Array, x: jax.Array, *, approximate: str = "none") -> jax.Array:
    _, vjp = jax.vjp(lambda v: _gelu(v, approximate=approximate), x)
    return vjp(grad)[0]


@register(aten.silu_backward.default)
def _silu_backward(grad: jax.Array, x: jax.Array) -> jax.Array:
    _, vjp = jax.vjp(_silu, x)
    return vjp(grad)[0]


@register(aten.nan_to_num.default)
def _nan_to_num(x: jax.Array, nan: float | None = None, posinf: float | None = None,
                neginf: float | None = None) -> jax.Array:
    return jnp.nan_to_num(x, nan=0.0 if nan is None else nan, posinf=posinf, neginf=neginf)


@register(aten.logit.default)
def _logit(x: jax.Array, eps: float | None = None) -> jax.Array:
    def fn(v: jax.Array) -> jax.Array:
        if eps is not None:
            v = jnp.clip(v, eps, 1 - eps)
        return jnp.log(v / (1 - v))

    return _elementwise(fn, _F, x)


@register(aten._to_copy.default)
def to_copy(x: jax.Array, *, dtype: torch.dtype | None = None, **_: object) -> jax.Array:
    """Device and layout arguments are the host's business; only the dtype changes values."""
    if dtype is None:
        return jnp.array(x, copy=True)
    target = jax_dtype(dtype)
    if target == jnp.bool_:
        return x != 0
    if jnp.issubdtype(target, jnp.integer) and jnp.issubdtype(x.dtype, jnp.floating):
        x = jnp.trunc(x)                         # C casts truncate; XLA's float->int does too, be explicit
    return x.astype(target)


@register(aten.complex.default)
def _complex(real: jax.Array, imag: jax.Array) -> jax.Array:
    return lax.complex(*jnp.broadcast_arrays(real, imag))


@register(aten.polar.default)
def _polar(absolute: jax.Array, angle: jax.Array) -> jax.Array:
    return lax.complex(absolute * jnp.cos(angle), absolute * jnp.sin(angle))


@register(aten.angle.default)
def _angle(x: jax.Array) -> jax.Array:
    if jnp.iscomplexobj(x):
        return jnp.angle(x)
    return _elementwise(lambda v: jnp.where(v < 0, jnp.pi, 0.0).astype(v.dtype) * jnp.where(jnp.isnan(v), jnp.nan, 1),
                        _F, x)


@register(aten.view_as_complex_copy.default, aten.view_as_complex.default)
def _view_as_complex(x: jax.Array) -> jax.Array:
    return lax.complex(x[..., 0], x[..., 1])


@register(aten.view_as_real_copy.default, aten.view_as_real.default)
def _view_as_real(x: jax.Array) -> jax.Array:
    return jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1)


@register(aten.frexp.Tensor)
def _frexp(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    mantissa, exponent = jnp.frexp(x)
    return mantissa, exponent.astype(jnp.int32)


@register(aten.dist.default)
def _dist(x: jax.Array, y: jax.Array, p: float = 2) -> jax.Array:
    return vector_norm(_elementwise(jnp.subtract, Kind.DEFAULT, x, y), p)
