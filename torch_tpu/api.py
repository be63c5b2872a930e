"""``torch_tpu.api``: TorchTPU's ``tpu_device()``, the "tpu" device (tpusim's, loaded with torch).

TorchTPU's is cached (``api.tpu_device.cache_clear()`` exists) and takes no argument; an ``index`` picks
``tpu:<index>`` here. Its private XLA CPU and CUDA devices raise: tpusim simulates TPUs only.
"""

import functools

import torch

from tpusim.backend.torchtpu import unsupported


@functools.cache
def tpu_device(index: int | None = None) -> torch.device:
    """The tpu device: ``torch.device("tpu")``, or ``tpu:<index>``."""
    return torch.device("tpu") if index is None else torch.device("tpu", index)


__getattr__ = unsupported.module_getattr("torch_tpu.api")
__all__ = ["tpu_device"]
