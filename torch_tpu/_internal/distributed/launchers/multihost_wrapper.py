"""``torch_tpu._internal.distributed.launchers.multihost_wrapper``: on tpusim the one simulated host's variables,
as ``singlehost_wrapper`` (TorchTPU asks the cloud for the other hosts of a TPU slice; larger simulated slices
are ``tpusim run --topology``)."""

import sys

import torch  # noqa: F401  (loads the tpu device, whose simulated host the variables describe)

from tpusim.backend.torchtpu.launchers import WorkerWrapper, main, prepare_tpu_environment, tpu_env_wrapper

__all__ = ["WorkerWrapper", "prepare_tpu_environment", "tpu_env_wrapper"]

if __name__ == "__main__":
    sys.exit(main())
