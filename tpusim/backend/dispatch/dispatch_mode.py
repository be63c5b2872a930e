"""The base of the dispatch modes tpusim runs around device work (tpu numerics, the pending Fused graph,
DTensor's whole draws).

Why: torch wraps a dispatch mode's ``__torch_dispatch__`` in Dynamo's disable, and that wrapper's first call
imports Dynamo (seconds) into programs that never compile. Dynamo never traces tpusim's own files
(tpusim/backend/torch_compile/jax_backend.py), so the wrapper guards nothing here and the modes opt out of it.
"""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode


class DeviceDispatchMode(TorchDispatchMode):
    """A TorchDispatchMode without Dynamo's guard around ``__torch_dispatch__`` (see the module docstring)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False
