"""torch_tpu's launch helpers: ``singlehost_wrapper`` (and its multi-host twin) and the ``handle_main`` shims.

    singlehost_wrapper.prepare_tpu_environment()          # in the launcher, before torchrun / mp.spawn
    g3_multiprocessing.handle_main(main)                  # runs main(argv) and exits with its status

    eval $(python -m torch_tpu._internal.distributed.launchers.singlehost_wrapper | sed 's/^/export /')
    torchrun --nproc_per_node=$WORLD_SIZE train.py

``prepare_tpu_environment(world_size=None)`` sets TorchTPU's launch variables where they are unset:
TORCH_TPU_XPROF_SESSION_ID, TORCH_TPU_SLICEBUILDER_ADDRESSES and TORCH_TPU_TOPOLOGY, the values of
``torch.tpu.distributed.set_tpu_launch_env`` for ``world_size`` ranks (default: every device of the
simulated host). tpusim's ranks need none of them (they meet through torchrun's variables); a rank reads
TORCH_TPU_TOPOLOGY as its slice's shape. Run as a module it prints TORCH_TPU_TOPOLOGY,
TORCH_TPU_SLICEBUILDER_ADDRESSES and WORLD_SIZE, as TorchTPU's does. The multi-host wrapper, which asks
the cloud for the other hosts' topology on TPU VMs, is the same one simulated host here.

``handle_main(main, argv=None)``: TorchTPU's open-source shim runs ``absl.app.run(main)``; here (absl is
not a dependency) ``main(sys.argv)`` runs and the process exits with its return value, as absl does
(flags are not parsed). ``handle_test_main`` calls ``main(*args, **kwargs)``; ``get_context`` is
multiprocessing's.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from tpusim.backend.torchtpu.distributed import TOPOLOGY_ENV, launch_env

ADDRESSES_ENV = "TORCH_TPU_SLICEBUILDER_ADDRESSES"


def prepare_tpu_environment(world_size: int | None = None) -> dict[str, str]:
    """Set TorchTPU's launch variables where unset (see the module docstring); returns the values now set."""
    for key, value in launch_env(world_size).items():
        os.environ.setdefault(key, value)
    return {key: os.environ[key] for key in launch_env(world_size)}


def host_variables() -> dict[str, str]:
    """What the wrapper prints run as a module: the host's topology, one address per device, WORLD_SIZE."""
    env = launch_env(None)
    return {TOPOLOGY_ENV: env[TOPOLOGY_ENV], ADDRESSES_ENV: env[ADDRESSES_ENV],
            "WORLD_SIZE": str(len(env[ADDRESSES_ENV].split(",")))}


def main() -> int:
    """Print ``host_variables`` one a line, TorchTPU's way: KEY="VALUE" (WORLD_SIZE bare)."""
    for key, value in host_variables().items():
        print(f"{key}={value}" if key == "WORLD_SIZE" else f'{key}="{value}"')
    return 0


class WorkerWrapper:
    """A picklable call of ``func`` with stored arguments first (what torchrun or mp.spawn runs per rank)."""

    def __init__(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self.func, self.args, self.kwargs = func, args, kwargs
        self.__name__ = getattr(func, "__name__", str(func))
        self.__qualname__ = getattr(func, "__qualname__", str(func))

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        self.func(*self.args, *args, **{**self.kwargs, **kwargs})


def tpu_env_wrapper(func: Callable[..., Any], args: tuple, *, world_size: int | None = None,
                    **kwargs: Any) -> WorkerWrapper:
    """Prepare the environment for ``world_size`` ranks and wrap ``func(*args, **kwargs)`` for the launcher."""
    prepare_tpu_environment(world_size)
    return WorkerWrapper(func, *args, **kwargs)


def handle_main(main: Callable[[list[str]], Any], argv: list[str] | None = None, **_: Any) -> NoReturn:
    """Run ``main(argv)`` (default ``sys.argv``) and exit with what it returns (absl.app.run's contract)."""
    sys.exit(main(list(sys.argv if argv is None else argv)))


def handle_test_main(main: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return main(*args, **kwargs)


def get_context(method: str | None = None) -> Any:
    return multiprocessing.get_context(method)


__all__ = ["WorkerWrapper", "get_context", "handle_main", "handle_test_main", "host_variables", "main",
           "prepare_tpu_environment", "tpu_env_wrapper"]
