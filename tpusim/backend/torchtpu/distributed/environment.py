"""``torch.tpu.distributed.environment``: where TorchTPU's launchers keep ``set_tpu_launch_env``.

    eval $(python -m torch.tpu.distributed.environment --nproc_per_node=4 | sed 's/^/export /')
"""

from __future__ import annotations

import sys

from tpusim.backend.torchtpu.distributed import launch_env, main, set_tpu_launch_env

__all__ = ["launch_env", "set_tpu_launch_env"]

if __name__ == "__main__":
    import torch  # noqa: F401  (registers the tpu device, whose config the variables come from)

    sys.exit(main())
