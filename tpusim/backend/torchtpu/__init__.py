"""TorchTPU's public API on the simulated device: scripts written for Google's TorchTPU run unchanged.

TorchTPU (github.com/google-pytorch/torch_tpu) declares its public names in tables: ``torch.tpu``,
``torch.tpu.distributed``, ``torch.tpu.compiler`` and ``torch.tpu.ops``. The same names live here,
one module per group, and tpusim/backend/device/tpu_module.py (``torch.tpu``) re-exports them:

- modes.py        ``EagerMode``, the settable ``torch.tpu.eager_mode``, ``set_eager_mode`` (tpusim/eager/modes.py's
                  debug, strict and fused under TorchTPU's member names)
- precision.py    ``Precision``, ``precision``, ``allow_excess_precision`` (recorded in the trace meta)
- cache.py        ``_get_cache_stats`` and friends: the live compile cache of torch.compile graphs and
                  the PJRT target, in TorchTPU's fields; ``_hbm_usage_summary`` from the simulated HBM
- hardware.py     what a device is on the simulated slice: ``get_local_device_attributes``, the rank
                  layout of ``topology_aware_mesh`` (from tpusim/placement)
- compiler.py     ``torch.tpu.compiler``: ``custom_compiler_options``; ``TpuCompileDebug``
- distributed/    ``torch.tpu.distributed``: ``set_tpu_launch_env``, ``spmd_safe``, ``topology_aware_mesh``,
                  the window striping knobs; ``python -m torch.tpu.distributed`` prints the launch variables
- ops.py          ``torch.tpu.ops``: splash attention, ragged_dot, the SparseCore ``sparse_dense_matmul``
                  family, each one op (``tpu::<name>``) with CPU numerics, priced by its own cost rule

- pallas.py, deferred.py, sync.py, profiler.py, checks.py, tracing.py, launchers.py: the names of TorchTPU's
                  ``torch_tpu`` package (``jax_op``; the pending Fused graph and ``computation_mlir``; ``profile``;
                  ``assert_close``; ``OpTracer``; ``singlehost_wrapper``, ``handle_main``), which the top-level
                  ``torch_tpu`` package (beside tpusim/) re-exports under TorchTPU's module paths

- unsupported.py  a name TorchTPU has that cannot mean anything without hardware (or that tpusim does not
                  model yet) is one row of its table: it exists and raises a ``TpusimError`` naming itself
                  and why when used, never an ``AttributeError``

``install`` makes the submodules importable as ``torch.tpu.<name>``.
"""

from __future__ import annotations

import sys
from types import ModuleType

import torch.backends

from tpusim.backend.torchtpu import compiler, distributed, ops, precision


def install(tpu: ModuleType) -> None:
    """Make ``torch.tpu.distributed``, ``torch.tpu.compiler`` and ``torch.tpu.ops`` importable (attributes of
    the ``torch.tpu`` module and entries of ``sys.modules``), and ``torch.backends.tpu`` exist."""
    for name, module in (("distributed", distributed), ("compiler", compiler), ("ops", ops)):
        setattr(tpu, name, module)
        sys.modules[f"torch.tpu.{name}"] = module
    torch.backends.tpu = precision.BACKEND_CONFIG
