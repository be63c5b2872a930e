"""TorchTPU's ``torch_tpu._internal.device``: ``_device_module``."""
