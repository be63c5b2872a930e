"""``torch_tpu._internal.sync``: materialize tpu tensors; the StableHLO of a pending one
(tpusim/backend/torchtpu/sync.py). The names are its ``sync`` module's, TorchTPU's layout.

``computation_mlir`` is best effort: see tpusim/backend/torchtpu/sync.py for what is pending on tpusim.
"""

from torch_tpu._internal.sync import sync
from torch_tpu._internal.sync.sync import *  # noqa: F403  (the same names at the package, as TorchTPU has them)

__all__ = [*sync.__all__, "sync"]
