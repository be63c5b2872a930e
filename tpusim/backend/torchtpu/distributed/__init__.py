"""``torch.tpu.distributed``: TorchTPU's launch helpers and distributed knobs on the simulated slice.

    torch.tpu.distributed.set_tpu_launch_env(nproc_per_node=4)   # then mp.spawn / torchrun, as with TorchTPU
    mesh = DeviceMesh("tpu", torch.tpu.distributed.topology_aware_mesh((2, 2)), mesh_dim_names=("dp", "tp"))

    @torch.tpu.distributed.spmd_safe
    def step(x): ...

From the shell, ``eval $(python -m torch.tpu.distributed --nproc_per_node 4 | sed 's/^/export /')`` sets the
launch variables before ``torchrun`` (``python -m torch.tpu.distributed.environment`` says the same).

- ``set_tpu_launch_env``: TorchTPU's launch variables (TORCH_TPU_TOPOLOGY, TORCH_TPU_SLICEBUILDER_ADDRESSES,
  TORCH_TPU_XPROF_SESSION_ID) in this process's environment, for the ranks it starts. tpusim needs none
  of them (ranks rendezvous through torchrun's variables and c10d's store); a rank reads
  TORCH_TPU_TOPOLOGY as the slice's shape (tpusim/backend/plumbing/config.py).
- ``topology_aware_mesh``: the rank layout from tpusim's placement (../hardware.py).
- ``spmd_safe``: TorchTPU materialises a function's inputs and outputs and lets its collectives run inside
  fused graphs; here pending fused work runs at entry and exit (the PJRT target's window is cut) and
  ``in_spmd_safe_region()`` says whether one is active; numbers and recording are unchanged.
- ``window_num_stripes`` / ``window_stripe_chunk_mb``: DMA striping of one-sided window transfers between
  TPUs (TorchTPU's WindowTpu, defaults 4 and 8). tpusim models no window transfers: the values are
  checked (> 0) and kept, and change nothing.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

from tpusim.backend.plumbing.state import STATE
from tpusim.backend.targets import flush_pending
from tpusim.backend.torchtpu import hardware, unsupported
from tpusim.errors import TpusimError

F = TypeVar("F", bound=Callable[..., Any])
topology_aware_mesh = hardware.topology_aware_mesh
TOPOLOGY_ENV = "TORCH_TPU_TOPOLOGY"


class _Knobs:
    num_stripes = 4          # TorchTPU's defaults (csrc/distributed/window_tpu.cc)
    stripe_chunk_mb = 8
    spmd_depth = 0


_K = _Knobs()


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise TpusimError(f"expected {name} to be > 0, got {value!r}")
    return value


def get_window_num_stripes() -> int:
    return _K.num_stripes


def set_window_num_stripes(value: int) -> None:
    _K.num_stripes = _positive("window_num_stripes", value)


def get_window_stripe_chunk_mb() -> int:
    return _K.stripe_chunk_mb


def set_window_stripe_chunk_mb(value: int) -> None:
    _K.stripe_chunk_mb = _positive("window_stripe_chunk_mb", value)


def launch_env(nproc_per_node: int | None = None) -> dict[str, str]:
    """The variables ``set_tpu_launch_env`` sets, for ``nproc_per_node`` ranks on one host (default: the
    host's devices)."""
    cfg = STATE.config
    n = cfg.devices_per_host if nproc_per_node is None else nproc_per_node
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= cfg.devices_per_host:
        raise TpusimError(f"set_tpu_launch_env(nproc_per_node={nproc_per_node!r}): a {cfg.chip.name} host has "
                          f"{cfg.devices_per_host} devices, so 1..{cfg.devices_per_host} (larger slices: "
                          f"tpusim run --topology, or TORCH_TPU_DEVICES_PER_HOST)")
    dims = hardware.even_dims(n)
    if n % cfg.chip.devices_per_chip:
        raise TpusimError(f"set_tpu_launch_env(nproc_per_node={n}): {cfg.chip.name} has {cfg.chip.devices_per_chip} "
                          f"devices per chip, so a whole number of chips needs a multiple of it")
    topology = ",".join(map(str, dims + (1,) * (3 - len(dims))))
    if cfg.chip.devices_per_chip > 1:
        topology += f",{cfg.chip.devices_per_chip}"
    base = int(os.environ.get("TORCH_TPU_BASE_PORT", "8070") or 8070)
    return {TOPOLOGY_ENV: topology,
            "TORCH_TPU_SLICEBUILDER_ADDRESSES": ",".join(f"localhost:{base + i}" for i in range(n)),
            "TORCH_TPU_XPROF_SESSION_ID": os.environ.get("TORCH_TPU_XPROF_SESSION_ID") or str(time.time_ns())}


def set_tpu_launch_env(nproc_per_node: int | None = None) -> dict[str, str]:
    """Set TorchTPU's launch variables in this process's environment (see the module docstring); returns them."""
    env = launch_env(nproc_per_node)
    os.environ.update(env)
    return env


def in_spmd_safe_region() -> bool:
    return _K.spmd_depth > 0


def spmd_safe(func: F) -> F:
    """Mark ``func`` SPMD safe (TorchTPU's decorator): pending work runs before and after it."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        flush_pending("sync")
        _K.spmd_depth += 1
        try:
            result = func(*args, **kwargs)
        finally:
            _K.spmd_depth -= 1
        flush_pending("sync")
        return result

    return wrapper  # type: ignore[return-value]


def main(argv: list[str] | None = None) -> int:
    """``python -m torch.tpu.distributed [--nproc_per_node N]``: print the launch variables as KEY=VALUE."""
    import argparse
    import shlex

    parser = argparse.ArgumentParser(prog="python -m torch.tpu.distributed",
                                     description="TorchTPU's launch variables for torchrun, one KEY=VALUE a line.")
    parser.add_argument("--nproc_per_node", "--nproc-per-node", type=int, default=None)
    args = parser.parse_args(argv)
    try:
        env = launch_env(args.nproc_per_node)
    except TpusimError as err:
        print(f"tpusim: {err}", file=sys.stderr)
        return 2
    for key, value in env.items():
        print(f"{key}={shlex.quote(value)}")
    return 0


__getattr__ = unsupported.module_getattr("torch.tpu.distributed")

__all__ = ["set_tpu_launch_env", "spmd_safe", "topology_aware_mesh", "window_num_stripes", "window_stripe_chunk_mb"]


class _DistributedModule(type(sys)):
    """``torch.tpu.distributed.window_num_stripes`` / ``window_stripe_chunk_mb`` as settable attributes."""

    window_num_stripes = property(lambda self: get_window_num_stripes(),
                                  lambda self, value: set_window_num_stripes(value))
    window_stripe_chunk_mb = property(lambda self: get_window_stripe_chunk_mb(),
                                      lambda self, value: set_window_stripe_chunk_mb(value))


sys.modules[__name__].__class__ = _DistributedModule
