"""``torch_tpu._internal.device._device_module``: ``DeviceModule``, the class behind TorchTPU's ``torch.tpu``.

Its class methods are ``torch.tpu``'s functions (tpusim/backend/device/tpu_module.py). The runtime hooks TorchTPU's
notebooks call to restart a TPU (``_init_runtime_options``, ``_shutdown_runtime``) do nothing: the simulated
device is ready from ``import torch`` to the end, so ``is_initialized()`` is always True.
"""

import torch


class _ForwardToTorchTpu(type):
    def __getattr__(cls, name: str) -> object:
        return getattr(torch.tpu, name)


class DeviceModule(metaclass=_ForwardToTorchTpu):
    """``torch.tpu`` as a class (TorchTPU's ``_DeviceModule``): unknown attributes are ``torch.tpu``'s."""

    _device_type = "tpu"
    _is_initialized = True
    _device_count: int | None = None
    _current_device: int | None = None

    @classmethod
    def is_initialized(cls) -> bool:
        return True

    @classmethod
    def _init_runtime_options(cls, device_type: str = "tpu") -> None:
        """Nothing to start: the simulated device runs from ``import torch``."""

    @classmethod
    def _shutdown_runtime(cls) -> None:
        """Nothing to stop (the device lives as long as the process)."""


TpuDeviceModule = DeviceModule
_DeviceModule = DeviceModule
__all__ = ["DeviceModule", "TpuDeviceModule"]
