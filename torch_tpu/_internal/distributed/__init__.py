"""TorchTPU's ``torch_tpu._internal.distributed``: ``launchers``, ``multiprocessing``."""
