"""``torch_tpu._internal.pallas``: ``jax_op`` and ``custom_jax_kernel`` (tpusim/backend/torchtpu/pallas.py).

A JAX function (Pallas kernels included) becomes one torch op; tpusim runs it with JAX on the host CPU
(Pallas in interpret mode) and prices it as one opaque kernel.
"""

from torch_tpu._internal.pallas import pallas
from torch_tpu._internal.pallas.pallas import custom_jax_kernel, jax_op

__all__ = ["custom_jax_kernel", "jax_op", "pallas"]
