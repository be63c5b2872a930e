"""``torch_tpu._internal.compile``: ``TpuBackend``, TorchTPU's torch.compile backend object
(tpusim/backend/torch_compile/jax_backend.py).

``torch.compile(model, backend=TpuBackend())`` is ``backend="tpu"``: tpusim's backend, with the
options given to the object (TorchTPU's ``options``) applied to every graph.
"""

from collections.abc import Callable

import torch

from tpusim.backend.torch_compile.jax_backend import tpu_backend


class TpuBackend:
    """The "tpu" torch.compile backend as an object; ``options`` are TorchTPU's (checked by tpusim)."""

    def __init__(self, **options: object) -> None:
        self.options = options

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list, **kwargs: object) -> Callable:
        return tpu_backend(gm, example_inputs, **{**self.options, **kwargs})


__all__ = ["TpuBackend"]
