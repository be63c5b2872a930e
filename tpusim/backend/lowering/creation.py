"""Factories, fills, copies and random ops.

Device, layout, pin_memory and memory_format arguments are the host's business and ignored.
Random ops draw from a jax PRNG key threaded through the traced function (``random_keys``): a
compiled graph gets a fresh key per call, derived from torch's generator, so a seeded program is
reproducible but draws different numbers than CPU PyTorch (bit-identical streams are not
portable across RNG algorithms; eager PJRT runs random ops on the host generator instead).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import jax
import jax.numpy as jnp
import torch

from tpusim.backend.lowering.dtypes import as_array, default_float, jax_dtype, torch_dtype
from tpusim.backend.lowering.elementwise import to_copy
from tpusim.backend.lowering.registry import register

aten = torch.ops.aten


def _dtype(dtype: torch.dtype | None, fill: object = None) -> object:
    if dtype is not None:
        return jax_dtype(dtype)
    if isinstance(fill, bool):
        return jnp.bool_
    if isinstance(fill, int):
        return jnp.int64
    if isinstance(fill, complex):
        return jnp.complex64
    return default_float()


@register(aten.empty.memory_format, aten.zeros.default, aten.new_zeros.default, aten.new_empty.default,
          aten.empty_strided.default, aten.new_empty_strided.default)
def _zeros(*args: object, dtype: torch.dtype | None = None, **_: object) -> jax.Array:
    """``empty`` is zeros: uninitialised memory has no portable value, and zeros keep runs deterministic."""
    size = args[1] if args and isinstance(args[0], jax.Array) else args[0]
    if dtype is None and args and isinstance(args[0], jax.Array):
        return jnp.zeros(tuple(size), args[0].dtype)
    return jnp.zeros(tuple(size), _dtype(dtype))


@register(aten.empty_permuted.default)
def _empty_permuted(size: Sequence[int], physical_layout: Sequence[int], *, dtype: torch.dtype | None = None,
                    **_: object) -> jax.Array:
    return jnp.zeros(tuple(size), _dtype(dtype))


@register(aten.ones.default, aten.new_ones.default)
def _ones(*args: object, dtype: torch.dtype | None = None, **_: object) -> jax.Array:
    size = args[1] if args and isinstance(args[0], jax.Array) else args[0]
    if dtype is None and args and isinstance(args[0], jax.Array):
        return jnp.ones(tuple(size), args[0].dtype)
    return jnp.ones(tuple(size), _dtype(dtype))


@register(aten.full.default)
def _full(size: Sequence[int], fill_value: object, *, dtype: torch.dtype | None = None, **_: object) -> jax.Array:
    return jnp.full(tuple(size), fill_value, _dtype(dtype, fill_value))


@register(aten.new_full.default)
def _new_full(x: jax.Array, size: Sequence[int], fill_value: object, *, dtype: torch.dtype | None = None,
              **_: object) -> jax.Array:
    return jnp.full(tuple(size), fill_value, jax_dtype(dtype) if dtype is not None else x.dtype)


def _like_dtype(x: jax.Array, dtype: torch.dtype | None) -> object:
    return jax_dtype(dtype) if dtype is not None else x.dtype


@register(aten.full_like.default)
def _full_like(x: jax.Array, fill_value: object, *, dtype: torch.dtype | None = None, **_: object) -> jax.Array:
    return jnp.full(x.shape, fill_value, _like_dtype(x, dtype))


@register(aten.zeros_like.default, aten.empty_like.default)
def _zeros_like(x: jax.Array, *, dtype: torch.dtype | None = None, **_: object) -> jax.Array:
    return jnp.zeros(x.shape, _like_dtype(x, dtype))


@register(aten.ones_like.default)
def _ones_like(x: jax.Array, *, dtype: torch.dtype | None = None, **_: object) -> jax.Array:
    return jnp.ones(x.shape, _like_dtype(x, dtype))


@register(aten.scalar_tensor.default)
def _scalar_tensor(s: object, *, dtype: torch.dtype | None = None, **_: object) -> jax.Array:
    return jnp.asarray(s, jax_dtype(dtype) if dtype is not None else default_float())


@register(aten.arange.start_step, aten.arange.start, aten.arange.default)
def _arange(*args: object, dtype: torch.dtype | None = None, **_: object) -> jax.Array:
    start, end, step = (0, args[0], 1) if len(args) == 1 else (args[0], args[1], args[2] if len(args) > 2 else 1)
    if dtype is None:
        floating = any(isinstance(v, float) for v in (start, end, step))
        target = default_float() if floating else jnp.int64
    else:
        target = jax_dtype(dtype)
    n = max(0, -(-(end - start) // step)) if isinstance(step, int) and isinstance(start, int) \
        and isinstance(end, int) else max(0, int(-(-(end - start) // step)))
    return (start + jnp.arange(n, dtype=jnp.float64 if jnp.issubdtype(target, jnp.floating) else jnp.int64)
            * step).astype(target)


@register(aten.linspace.default)
def _linspace(start: object, end: object, steps: int, *, dtype: torch.dtype | None = None, **_: object) -> jax.Array:
    return jnp.linspace(start, end, steps).astype(_dtype(dtype, 1.0) if dtype is None else jax_dtype(dtype))


@register(aten.eye.default, aten.eye.m)
def _eye(n: int, m: int | None = None, *, dtype: torch.dtype | None = None, **_: object) -> jax.Array:
    return jnp.eye(n, m, dtype=_dtype(dtype))


@register(aten.fill.Scalar, aten.fill.Tensor)
def _fill(x: jax.Array, value: object) -> jax.Array:
    return jnp.full(x.shape, as_array(value, x.dtype))


@register(aten.zero.default)
def _zero(x: jax.Array) -> jax.Array:
    return jnp.zeros_like(x)


@register(aten.copy.default)
def _copy(x: jax.Array, src: jax.Array, non_blocking: bool = False) -> jax.Array:
    return jnp.broadcast_to(to_copy(src, dtype=torch_dtype(x.dtype)), x.shape)


@register(aten._local_scalar_dense.default, jit=False)
def _local_scalar_dense(x: jax.Array) -> object:
    return x.item()


# ---------------------------------------------------------------- random

class _Keys:
    key: jax.Array | None = None


_KEYS = _Keys()


@contextlib.contextmanager
def random_keys(key: jax.Array) -> Iterator[None]:
    """Random lowerings traced inside draw subkeys of ``key`` (a traced input of the function)."""
    saved, _KEYS.key = _KEYS.key, key
    try:
        yield
    finally:
        _KEYS.key = saved


def next_key() -> jax.Array:
    if _KEYS.key is None:
        raise NotImplementedError("tpusim lowering: random op outside a random_keys() context")
    _KEYS.key, sub = jax.random.split(_KEYS.key)
    return sub


@register(aten.rand.default)
def _rand(size: Sequence[int], *, dtype: torch.dtype | None = None, **_: object) -> jax.Array:
    return jax.random.uniform(next_key(), tuple(size), _dtype(dtype))


@register(aten.randn.default)
def _randn(size: Sequence[int], *, dtype: torch.dtype | None = None, **_: object) -> jax.Array:
    return jax.random.normal(next_key(), tuple(size), _dtype(dtype))


@register(aten.rand_like.default)
def _rand_like(x: jax.Array, *, dtype: torch.dtype | None = None, **_: object) -> jax.Array:
    return jax.random.uniform(next_key(), x.shape, _like_dtype(x, dtype))


@register(aten.randn_like.default)
def _randn_like(x: jax.Array, *, dtype: torch.dtype | None = None, **_: object) -> jax.Array:
    return jax.random.normal(next_key(), x.shape, _like_dtype(x, dtype))


@register(aten.randperm.default)
def _randperm(n: int, *, dtype: torch.dtype | None = None, **_: object) -> jax.Array:
    return jax.random.permutation(next_key(), n).astype(jax_dtype(dtype) if dtype is not None else jnp.int64)


@register(aten.normal.Tensor_Tensor, aten.normal.Tensor_float, aten.normal.float_Tensor)
def _normal(mean: object, std: object, *, generator: object = None) -> jax.Array:
    shape = jnp.broadcast_shapes(jnp.shape(mean), jnp.shape(std))
    dtype = next(a.dtype for a in (mean, std) if isinstance(a, jax.Array))
    return (mean + std * jax.random.normal(next_key(), shape, dtype)).astype(dtype)


@register(aten.normal.float_float)
def _normal_ff(mean: float, std: float, size: Sequence[int], *, dtype: torch.dtype | None = None,
               **_: object) -> jax.Array:
    return mean + std * jax.random.normal(next_key(), tuple(size), _dtype(dtype))


@register(aten.randint_like.default, aten.randint_like.low_dtype)
def _randint_like(x: jax.Array, *args: object, dtype: torch.dtype | None = None, **_: object) -> jax.Array:
    low, high = (0, args[0]) if len(args) == 1 else args[:2]
    return jax.random.randint(next_key(), x.shape, low, high, jnp.int64).astype(_like_dtype(x, dtype))


@register(aten.randint.low, aten.randint.default)
def _randint(*args: object, dtype: torch.dtype | None = None, **_: object) -> jax.Array:
    low, high, size = (0, args[0], args[1]) if len(args) == 2 else args[:3]
    return jax.random.randint(next_key(), tuple(size), low, high,
                              jnp.int64).astype(jax_dtype(dtype) if dtype else jnp.int64)


@register(aten.bernoulli.default, aten.bernoulli.p)
def _bernoulli(x: jax.Array, p: float | None = None, *, generator: object = None) -> jax.Array:
    prob = x if p is None else p
    return jax.random.bernoulli(next_key(), prob, x.shape).astype(x.dtype)


@register(aten.native_dropout.default)
def _native_dropout(x: jax.Array, p: float, train: bool | None) -> tuple[jax.Array, jax.Array]:
    if not train or p == 0:
        return x, jnp.ones(x.shape, jnp.bool_)
    keep = jax.random.bernoulli(next_key(), 1.0 - p, x.shape)
    return jnp.where(keep, x / (1.0 - p), 0).astype(x.dtype), keep


@register(aten.native_dropout_backward.default)
def _native_dropout_backward(grad: jax.Array, mask: jax.Array, scale: float) -> jax.Array:
    return (grad * mask * scale).astype(grad.dtype)


@register(aten.uniform.default)
def _uniform(x: jax.Array, low: float = 0.0, high: float = 1.0, *, generator: object = None) -> jax.Array:
    return jax.random.uniform(next_key(), x.shape, x.dtype, low, high)


@register(aten.exponential.default)
def _exponential(x: jax.Array, lambd: float = 1.0, *, generator: object = None) -> jax.Array:
    return (jax.random.exponential(next_key(), x.shape, x.dtype) / lambd).astype(x.dtype)


@register(aten.cauchy.default)
def _cauchy(x: jax.Array, median: float = 0.0, sigma: float = 1.0, *, generator: object = None) -> jax.Array:
    return (median + sigma * jax.random.cauchy(next_key(), x.shape, x.dtype)).astype(x.dtype)


@register(aten.log_normal.default)
def _log_normal(x: jax.Array, mean: float = 1.0, std: float = 2.0, *, generator: object = None) -> jax.Array:
    return jnp.exp(mean + std * jax.random.normal(next_key(), x.shape, x.dtype)).astype(x.dtype)


@register(aten.geometric.default)
def _geometric(x: jax.Array, p: float, *, generator: object = None) -> jax.Array:
    return jax.random.geometric(next_key(), p, x.shape).astype(x.dtype)


@register(aten.normal_functional.default)
def _normal_functional(x: jax.Array, mean: float = 0.0, std: float = 1.0, *, generator: object = None) -> jax.Array:
    return (mean + std * jax.random.normal(next_key(), x.shape, x.dtype)).astype(x.dtype)
