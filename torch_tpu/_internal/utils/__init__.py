"""TorchTPU's ``torch_tpu._internal.utils``: ``utils``, ``test_utils``, ``log_utils``."""
