"""torch.distributed on the simulated slice: the c10d backend "tpusim" for device "tpu".

    import torch                                       # the device registers the "tpusim" name for "tpu",
    dist.init_process_group("tpusim")                  # and TorchTPU's "tpu_dist" and "tpu" for the same
                                                       # backend (tpusim/backend/device/registration.py);
                                                       # this package loads at the first process group
                                                       # (or no backend: "tpusim" is the default for tpu)
    mesh = init_device_mesh("tpu", (64, 8), mesh_dim_names=("fsdp", "tp"))

Two ways to run a world (``TPUSIM_RANKS``, set by ``tpusim run --ranks``):

- ``one``: this process is rank 0 of the whole world; collectives compute their result by the
  symmetry rule of numerics.py (every peer holds what this rank holds) and are priced on the full
  torus. ``init_process_group`` needs no rendezvous (a HashStore stands in).
- ``all``: one process per rank (launcher.py starts them, or plain ``torchrun`` when TPUSIM_RANKS is
  unset and the world has several ranks); data really moves (gloo on loopback, transport.py), and every
  collective is fingerprinted across ranks first (hang.py).

Map: process_group.py (the ProcessGroup: every collective), numerics.py (the --ranks one rule),
transport.py (gloo), p2p.py (isend/irecv: messages that complete when both sides posted them),
hang.py (fingerprints, diagnosis), control_store.py (the control values, signed with the run's secret so
another local process cannot forge them), emit.py (trace records, mesh layouts), dtensor_random.py (DTensor's
random ops on tpu meshes: whole draws, so sharded init equals CPU's),
launcher.py (one process per rank, output by rank, crash handling), worker.py (a rank's process),
env.py (torchrun-style environment from the topology).
"""

from __future__ import annotations

import functools
import os
import sys

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.distributed.device_mesh import DeviceMesh

from tpusim.backend.distributed import dtensor_random, emit
from tpusim.backend.distributed.hang import CollectiveMismatchError
from tpusim.backend.distributed.process_group import TpusimProcessGroup
from tpusim.backend.plumbing.import_hooks import after_import

__all__ = ["BACKEND", "CollectiveMismatchError", "TpusimProcessGroup", "install"]

BACKEND = "tpusim"
_REPLACED = ("gloo", "nccl", "cpu:gloo,cuda:nccl", "xla", "undefined")
_installed = False


def _create(opts: object, backend_options: object) -> TpusimProcessGroup:
    return TpusimProcessGroup(opts, backend_options)


def install() -> None:
    """Register the "tpusim" backend for device "tpu" and the launch-time conveniences (idempotent)."""
    global _installed
    if _installed:
        return
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["tpu"])
    _patch_init_process_group()
    _patch_device_mesh()
    after_import("torch.distributed.tensor._random", dtensor_random.install)
    _installed = True


def _patch_init_process_group() -> None:
    """Under ``tpusim run`` (TPUSIM_RANKS set): a script written for torchrun runs unchanged.

    Its "nccl"/"gloo" backend becomes "tpusim" (the slice's interconnect; TorchTPU's "tpu_dist" and "tpu"
    already are, registered by tpusim/backend/device/registration.py), and with ``--ranks one``
    the rendezvous is a local HashStore, since the other ranks exist only in the simulator."""
    original = c10d.init_process_group
    if getattr(original, "_tpusim", False):
        return

    @functools.wraps(original)
    def init_process_group(backend=None, init_method=None, *args, **kwargs):
        mode = os.environ.get("TPUSIM_RANKS", "")
        if mode:
            if backend is None or str(backend).lower() in _REPLACED:
                if backend is not None:
                    print(f"tpusim: backend {backend!r} runs as 'tpusim' (the simulated slice's ICI)",
                          file=sys.stderr)
                backend = BACKEND
            if mode == "one" and kwargs.get("store") is None and init_method in (None, "env://"):
                kwargs["store"] = dist.HashStore()
                kwargs.setdefault("world_size", int(os.environ.get("WORLD_SIZE", "1")))
                kwargs.setdefault("rank", int(os.environ.get("RANK", "0")))
                init_method = None
        return original(backend, init_method, *args, **kwargs)

    init_process_group._tpusim = True
    c10d.init_process_group = init_process_group
    dist.init_process_group = init_process_group


def _patch_device_mesh() -> None:
    """Remember every root DeviceMesh on "tpu" (dims, shape, ranks) for placement (emit.MESHES)."""
    original = DeviceMesh.__init__
    if getattr(original, "_tpusim", False):
        return

    @functools.wraps(original)
    def __init__(self, device_type, *args, **kwargs):
        original(self, device_type, *args, **kwargs)
        try:
            if device_type == "tpu" and getattr(self, "_root_mesh", None) is None:
                mesh = self.mesh
                emit.note_mesh(self.mesh_dim_names, mesh.flatten().tolist(), tuple(mesh.shape))
        except Exception:  # bookkeeping must never break the user's mesh
            pass

    __init__._tpusim = True
    DeviceMesh.__init__ = __init__


install()
