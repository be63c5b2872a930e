"""``torch_tpu._internal.distributed.launchers.singlehost_wrapper``: TorchTPU's launch variables for torchrun.

    eval $(python -m torch_tpu._internal.distributed.launchers.singlehost_wrapper | sed 's/^/export /')

``prepare_tpu_environment(world_size=None)`` sets what is unset of TORCH_TPU_XPROF_SESSION_ID,
TORCH_TPU_SLICEBUILDER_ADDRESSES and TORCH_TPU_TOPOLOGY; run as a module it prints TORCH_TPU_TOPOLOGY,
TORCH_TPU_SLICEBUILDER_ADDRESSES and WORLD_SIZE (tpusim/backend/torchtpu/launchers.py).
"""

import sys

import torch  # noqa: F401  (loads the tpu device, whose simulated host the variables describe)

from tpusim.backend.torchtpu.launchers import WorkerWrapper, main, prepare_tpu_environment, tpu_env_wrapper

__all__ = ["WorkerWrapper", "prepare_tpu_environment", "tpu_env_wrapper"]

if __name__ == "__main__":
    sys.exit(main())
