"""TorchTPU's shim path (see g3_multiprocessing.py)."""
