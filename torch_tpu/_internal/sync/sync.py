"""``torch_tpu._internal.sync.sync``: TorchTPU's module of the same functions (tpusim/backend/torchtpu/sync.py)."""

from tpusim.backend.torchtpu.sync import (
    computation_graphviz,
    computation_mlir,
    dump_computation_graphviz,
    dump_computation_mlir,
    is_bufferless_zero_size,
    is_materialized,
    is_materializing,
    is_ready,
    synchronize,
)

__all__ = ["computation_graphviz", "computation_mlir", "dump_computation_graphviz", "dump_computation_mlir",
           "is_bufferless_zero_size", "is_materialized", "is_materializing", "is_ready", "synchronize"]
