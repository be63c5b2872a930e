"""PyTorch dtype semantics on jax arrays: dtype maps and elementwise type promotion.

Promotion is PyTorch's own (``torch._prims_common.elementwise_dtypes``) applied to meta
stand-ins of the jax arrays, so dimensioned tensors outrank 0-dim tensors, which outrank Python
scalars, and "int -> float" ops compute in the default float dtype exactly as on CPU. Results are
cached per signature: the cost is paid once per traced shape, never per executed step.
"""

from __future__ import annotations

import functools
from numbers import Number

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as Kind
from torch._prims_common import elementwise_dtypes

jax.config.update("jax_enable_x64", True)   # int64 indices and float64 exist in PyTorch programs

_TO_JAX: dict[torch.dtype, object] = {
    torch.float32: jnp.float32, torch.float64: jnp.float64, torch.float16: jnp.float16,
    torch.bfloat16: jnp.bfloat16, torch.int64: jnp.int64, torch.int32: jnp.int32, torch.int16: jnp.int16,
    torch.int8: jnp.int8, torch.uint8: jnp.uint8, torch.bool: jnp.bool_, torch.complex64: jnp.complex64,
    torch.complex128: jnp.complex128, torch.uint16: jnp.uint16, torch.uint32: jnp.uint32,
    torch.uint64: jnp.uint64, torch.float8_e4m3fn: jnp.float8_e4m3fn, torch.float8_e5m2: jnp.float8_e5m2,
}
_TO_TORCH: dict[np.dtype, torch.dtype] = {np.dtype(v): k for k, v in _TO_JAX.items()}

__all__ = ["Kind", "jax_dtype", "torch_dtype", "promote", "result_dtype", "as_array", "default_float"]


def jax_dtype(dtype: torch.dtype | None) -> object:
    """The jax dtype of a torch dtype (None stays None)."""
    if dtype is None:
        return None
    try:
        return _TO_JAX[dtype]
    except KeyError:
        raise NotImplementedError(f"tpusim lowering: dtype {dtype} has no jax equivalent") from None


def torch_dtype(dtype: object) -> torch.dtype:
    return _TO_TORCH[np.dtype(dtype)]


def default_float() -> object:
    return jax_dtype(torch.get_default_dtype())


def _standin(x: object) -> object:
    if isinstance(x, jax.Array | np.ndarray) or hasattr(x, "aval"):
        return ("t", torch_dtype(x.dtype), x.ndim == 0)
    if isinstance(x, bool):
        return ("s", bool)
    if isinstance(x, int):
        return ("s", int)
    if isinstance(x, float):
        return ("s", float)
    if isinstance(x, complex):
        return ("s", complex)
    return None


_SCALAR = {bool: True, int: 1, float: 1.0, complex: 1j}


@functools.lru_cache(maxsize=4096)
def _promote(sig: tuple, kind: Kind) -> tuple[object, object]:
    args = []
    for s in sig:
        if s is None:
            continue
        if s[0] == "t":
            args.append(torch.empty(() if s[2] else (1,), dtype=s[1], device="meta"))
        else:
            args.append(_SCALAR[s[1]])
    comp, res = elementwise_dtypes(*args, type_promotion_kind=kind)
    return jax_dtype(comp), jax_dtype(res)


def promote(*args: object, kind: Kind = Kind.DEFAULT) -> tuple[object, object]:
    """(computation dtype, result dtype) of an elementwise op over ``args``, as PyTorch decides."""
    return _promote(tuple(_standin(a) for a in args), kind)


def result_dtype(*args: object) -> object:
    return promote(*args, kind=Kind.NO_OPMATH)[1]


def as_array(x: object, dtype: object = None) -> jax.Array:
    """A jax array of ``x`` (tensor or Python scalar) in ``dtype`` (no copy when it already is)."""
    if isinstance(x, Number):
        return jnp.asarray(x, dtype=dtype)
    if dtype is not None and x.dtype != dtype:
        return x.astype(dtype)
    return x
