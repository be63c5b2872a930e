"""tpusim's stand-in for Google's TorchTPU package (``torch_tpu``): TorchTPU's scripts, notebooks and examples run
unchanged on the simulated "tpu" device.

    import torch_tpu                             # what TorchTPU's scripts begin with: works, and is optional
    from torch_tpu import api
    device = api.tpu_device()                    # torch.device("tpu")

TorchTPU loads its device with this import (and through its ``torch.backends`` entry point); tpusim's device
loads at ``import torch`` (and at this import when ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``), so here the import
otherwise only makes TorchTPU's module paths exist: ``torch_tpu.api``,
``torch_tpu._internal.execution_mode``, ``.sync``, ``.profiler``, ``.pallas``, ``.utils`` (``utils``,
``test_utils``, ``log_utils``), ``.distributed`` (``launchers.singlehost_wrapper``, ``multiprocessing``),
``.device._device_module``, ``.compile``, ``.precision`` and ``torch_tpu.shims.g3_multiprocessing``. Each is a
thin module over tpusim's implementation of the same behaviour (tpusim/backend/torchtpu/, one module per
group; docs/torchtpu.md maps every name and says where it differs). A name TorchTPU has that cannot mean
anything without TPU hardware raises a ``TpusimError`` naming itself and why when used.

Installing Google's ``torch-tpu`` wheel beside tpusim is not supported: both ship this top-level package, so
pip would overwrite one with the other (whichever comes first on ``sys.path`` wins the import), and the
wheel's ``torch.backends`` entry point would try to register a second "tpu" PrivateUse1 backend at
``import torch`` (PyTorch allows one; TorchTPU's loader also needs libtpu and a TPU on the PCI bus). Use a
separate environment for the real TorchTPU.
"""

import torch  # noqa: F401  (loads tpusim's "tpu" device, as TorchTPU's import loads its own)

import tpusim.backend  # noqa: F401,E402  (and again with TORCH_DEVICE_BACKEND_AUTOLOAD=0: this import registers it)

__all__: list[str] = []
