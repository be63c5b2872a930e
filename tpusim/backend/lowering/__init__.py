"""ATen -> JAX lowering table (``tpusim.backend.lowering``), shared by torch.compile and the PJRT target.

Map: registry.py (the table and ``@register``), dtypes.py (PyTorch promotion on jax arrays),
one module per op family (elementwise, reductions, matmul, shape, indexing, creation, nn) and
interpreter.py (an ATen FX graph -> a JAX function). Importing the package fills the table and
turns on jax's 64-bit mode (PyTorch programs use int64 indices).
"""

from __future__ import annotations

from tpusim.backend.lowering import creation, elementwise, indexing, matmul, nn, reductions, shape  # noqa: F401
from tpusim.backend.lowering.interpreter import (
    MissingLowering,
    jax_function,
    jax_to_tensor,
    missing_ops,
    tensor_to_jax,
    tensor_to_numpy,
)
from tpusim.backend.lowering.registry import LOWERINGS, Lowering, covered, lookup, register

__all__ = ["LOWERINGS", "Lowering", "MissingLowering", "covered", "jax_function", "jax_to_tensor", "lookup",
           "missing_ops", "register", "tensor_to_jax", "tensor_to_numpy"]
