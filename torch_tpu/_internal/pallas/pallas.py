"""``torch_tpu._internal.pallas.pallas``: TorchTPU's module of the JAX bridge (tpusim/backend/torchtpu/pallas.py)."""

from tpusim.backend.torchtpu.pallas import JaxCallable, custom_jax_kernel, custom_kernel, jax_op

__all__ = ["JaxCallable", "custom_jax_kernel", "custom_kernel", "jax_op"]
