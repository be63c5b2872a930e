"""``python -m torch.tpu.distributed [--nproc_per_node N]``: TorchTPU's launch variables, one KEY=VALUE a line."""

import sys

import torch  # noqa: F401  (registers the tpu device, whose config the variables come from)

from tpusim.backend.torchtpu.distributed import main

sys.exit(main())
