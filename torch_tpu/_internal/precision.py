"""``torch_tpu._internal.precision``: ``Precision`` and ``precision``, as ``torch.tpu``'s
(tpusim/backend/torchtpu/precision.py)."""

from tpusim.backend.torchtpu.precision import Precision, precision

__all__ = ["Precision", "precision"]
