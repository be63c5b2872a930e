"""JAX lowerings of torch.tpu.ops' kernels, so a torch.compile'd graph that calls one lowers whole.

Why here and not in tpusim/backend/lowering/: the kernels' ops exist once this package defines them, and the
lowering table must not import this package (it imports the table: tpusim/backend/torchtpu/ops.py imports this
module when the table's nn module is imported). Adding a kernel's lowering = one ``@register`` function here.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from tpusim.backend.lowering.nn import _fused_attention, _fused_attention_backward
from tpusim.backend.lowering.registry import register


def _window_mask(s: int, t: int, causal: bool, window: int) -> jax.Array | None:
    """torch.tpu.ops.splash_attention's mask: True where query i may attend key j (None: everywhere)."""
    if not causal and window < 0:
        return None
    i, j = jnp.arange(s)[:, None], jnp.arange(t)[None, :]
    keep = j <= i
    return keep & (j >= i - window) if window >= 0 else keep


@register(torch.ops.tpu.splash_attention.default)
def _splash(q: jax.Array, k: jax.Array, v: jax.Array, scale: float, causal: bool, window: int
            ) -> tuple[jax.Array, jax.Array]:
    """TorchTPU's splash kernel (torch.tpu.ops.splash_attention) in a compiled graph: (output, log-sum-exp),
    the formulas of its eager kernel (tpusim/backend/torchtpu/ops.py), scores in float32."""
    mask = _window_mask(q.shape[-2], k.shape[-2], causal, window)
    return _fused_attention(q, k, v, mask, 0.0, False, scale)


@register(torch.ops.tpu.splash_attention_backward.default)
def _splash_backward(q: jax.Array, k: jax.Array, v: jax.Array, out: jax.Array, lse: jax.Array, grad: jax.Array,
                     scale: float, causal: bool, window: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    mask = _window_mask(q.shape[-2], k.shape[-2], causal, window)
    return _fused_attention_backward(grad, q, k, v, mask, out, lse, False, scale)
