"""TorchTPU's launchers: ``singlehost_wrapper``, ``multihost_wrapper`` (tpusim/backend/torchtpu/launchers.py)."""
