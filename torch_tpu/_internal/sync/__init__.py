"""``torch_tpu._internal.sync``: materialize tpu tensors; the StableHLO of a pending one
(tpusim/backend/torchtpu/sync.py).

``computation_mlir`` is best effort: see tpusim/backend/torchtpu/sync.py for what is pending on tpusim.
"""

from torch_tpu._internal.sync import sync
from torch_tpu._internal.sync.sync import (
    computation_graphviz,
    computation_mlir,
    dump_computation_graphviz,
    dump_computation_mlir,
    is_bufferless_zero_size,
    is_materialized,
    is_ready,
    synchronize,
)

__all__ = ["computation_graphviz", "computation_mlir", "dump_computation_graphviz", "dump_computation_mlir",
           "is_bufferless_zero_size", "is_materialized", "is_ready", "sync", "synchronize"]
