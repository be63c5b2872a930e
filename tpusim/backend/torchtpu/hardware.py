"""Where a device sits on the simulated slice: its attributes, and the rank layout of ``topology_aware_mesh``.

A rank's device: torch rank ``r`` of a world drives global device ``r`` (one process per device, as
under TorchTPU; a process with several devices drives ``r * devices + index``). Global device ``d`` is
core ``d % devices_per_chip`` of chip ``d // devices_per_chip`` (two cores per chip on v7), and chips are
numbered x-fastest over the slice, as tpusim/slice/topology.py numbers them. The slice's shape is
``DeviceConfig.topology`` (TORCH_TPU_TOPOLOGY) when given, else the world's chips spread over the chip's
torus axes as evenly as powers of two allow (2 chips: 2x1x1, 4: 2x2x1, 8: 2x2x2).
"""

from __future__ import annotations

import math
import os

import torch

from tpusim.backend.plumbing.state import STATE
from tpusim.errors import TpusimError
from tpusim.trace.records import Mesh


def world_size() -> int:
    """The torch.distributed world when one is initialised, else torchrun's WORLD_SIZE (1 alone)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def rank() -> int:
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0") or 0)


def even_dims(devices: int) -> tuple[int, ...]:
    """The chips of ``devices`` devices spread over the chip's torus axes, prime factors onto the shortest
    axis first (2 chips: 2x1x1, 4: 2x2x1, 8: 2x2x2)."""
    chip = STATE.config.chip
    n = max(1, -(-devices // chip.devices_per_chip))
    dims = [1] * chip.torus_dims
    while n > 1:
        factor = next(p for p in range(2, n + 1) if n % p == 0)
        dims[dims.index(min(dims))] *= factor
        n //= factor
    return tuple(dims)


def slice_dims(devices: int) -> tuple[int, ...]:
    """Chips along each torus axis of one slice holding ``devices`` devices: TORCH_TPU_TOPOLOGY when given
    (``DeviceConfig.topology``), else ``even_dims``."""
    cfg = STATE.config
    return tuple(cfg.topology) if cfg.topology is not None else even_dims(devices)


def _coord(chip: int, dims: tuple[int, ...]) -> tuple[int, ...]:
    coord = []
    for n in dims:
        chip, c = divmod(chip, n)
        coord.append(c)
    return tuple(coord)


def local_device_attributes(index: int | None = None) -> dict[str, object]:
    """``torch.tpu.get_local_device_attributes()``: the PJRT attributes of this process's device on the
    simulated slice (``id``, ``coords``, ``core_on_chip``, ``process_index``, ``slice_index``, ``device_kind``)."""
    cfg = STATE.config
    local = STATE.shim.current_device() if index is None else index
    device = rank() * cfg.device_count + local
    per_chip = cfg.chip.devices_per_chip
    dims = slice_dims(world_size() * cfg.device_count)
    per_slice = math.prod(dims) * per_chip                  # a multislice world: slice after slice
    coords = _coord(device % per_slice // per_chip, dims) + (0,) * (3 - len(dims))
    return {"id": device, "coords": coords[:3], "core_on_chip": device % per_chip,
            "process_index": device // cfg.devices_per_host, "slice_index": device // per_slice,
            "device_kind": (cfg.chip.jax_device_kinds or (cfg.chip.display_name,))[0], "platform": "tpu"}


def rank_layout(mesh_shape: tuple[int, ...], devices: int) -> torch.Tensor:
    """Global ranks laid out as ``mesh_shape`` over one slice of ``devices`` devices, by tpusim's default
    placement (tpusim/placement/mesh.py: the innermost mesh dim on x first, then y, z). On chips with two
    devices the innermost mesh dim that the devices per chip divide takes the two cores of a chip first."""
    shape = _shape(mesh_shape)
    if math.prod(shape) != devices:
        raise TpusimError(f"topology_aware_mesh: mesh_shape {shape} holds {math.prod(shape)} ranks but the world "
                          f"has {devices}; the product of mesh_shape must be the world size")
    cfg = STATE.config
    per_chip = cfg.chip.devices_per_chip
    core_dim = next((d for d in reversed(range(len(shape))) if shape[d] % per_chip == 0), None)
    if per_chip > 1 and core_dim is None:
        return torch.arange(devices, dtype=torch.int64).reshape(shape)
    chip_shape = list(shape)
    if per_chip > 1:
        chip_shape[core_dim] //= per_chip
    dims = slice_dims(devices)
    if math.prod(dims) * per_chip != devices:
        raise TpusimError(f"topology_aware_mesh: the slice {'x'.join(map(str, dims))} (TORCH_TPU_TOPOLOGY) has "
                          f"{math.prod(dims) * per_chip} devices but one slice of this mesh has {devices}")
    # Function-level: placement and topology pull in networkx and pricing (~0.6 s), needed only to lay out a mesh
    from tpusim.placement.mesh import default_placement
    from tpusim.slice.topology import build_slice

    slice_ = build_slice(f"{len(dims)}d:{'x'.join(map(str, dims))}", chip=cfg.chip)
    names = tuple(f"dim{i}" for i in range(len(shape)))
    chips = math.prod(chip_shape)
    placement = default_placement(Mesh(names, tuple(chip_shape), tuple(range(chips))), slice_)
    physical = placement.physical(slice_)                      # logical chip position -> physical chip
    layout = torch.tensor([physical[p] for p in range(chips)], dtype=torch.int64).reshape(chip_shape)
    if per_chip == 1:
        return layout
    # each chip position of core_dim becomes per_chip consecutive positions, its cores
    cores = torch.arange(per_chip, dtype=torch.int64)
    expanded = (layout.unsqueeze(core_dim + 1) * per_chip +
                cores.reshape([per_chip if i == core_dim + 1 else 1 for i in range(len(shape) + 1)]))
    return expanded.reshape(shape)


def _shape(mesh_shape: object) -> tuple[int, ...]:
    if isinstance(mesh_shape, int):
        mesh_shape = (mesh_shape,)
    shape = tuple(mesh_shape) if isinstance(mesh_shape, tuple | list | torch.Size) else None
    if not shape or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in shape):
        raise TpusimError(f"topology_aware_mesh: mesh_shape {mesh_shape!r}; accepted: a tuple of whole "
                          f"numbers >= 1, ordered by increasing network intensity, e.g. (dp, tp) = (2, 4)")
    return shape


def topology_aware_mesh(mesh_shape: tuple[int, ...], *, topology: str = "single_slice",
                        dcn_mesh_shape: tuple[int, ...] | None = None, process_is_granule: bool = False,
                        allow_split_physical_axes: bool = False, contiguous_submeshes: bool = False) -> torch.Tensor:
    """TorchTPU's ``topology_aware_mesh``: an int64 tensor of global ranks shaped ``mesh_shape`` (for
    ``topology="multi_slice"``: ``dcn_mesh_shape * mesh_shape`` elementwise, one slice per DCN position;
    TORCH_TPU_TOPOLOGY is then one slice's shape),
    for ``DeviceMesh("tpu", mesh=...)``. Needs an initialised process group, as TorchTPU's does.
    ``process_is_granule``, ``allow_split_physical_axes`` and ``contiguous_submeshes`` are accepted and
    change nothing: tpusim's placement never splits an axis it cannot and places one slice at a time."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("PyTorch distributed process group must be initialized before calling "
                           "topology_aware_mesh.")
    world = dist.get_world_size()
    if topology == "single_slice":
        return rank_layout(mesh_shape, world)
    if topology != "multi_slice":
        raise ValueError(f"Unknown topology: {topology!r}")
    if dcn_mesh_shape is None:
        raise ValueError("topology='multi_slice' requires dcn_mesh_shape")
    inner, outer = _shape(mesh_shape), _shape(dcn_mesh_shape)
    if len(inner) != len(outer):
        raise TpusimError(f"topology_aware_mesh: dcn_mesh_shape {outer} and mesh_shape {inner} need as many dims")
    per_slice = math.prod(inner)
    if per_slice * math.prod(outer) != world:
        raise TpusimError(f"topology_aware_mesh: {outer} slices of {inner} hold {per_slice * math.prod(outer)} ranks "
                          f"but the world has {world}")
    layout = rank_layout(inner, per_slice)
    slices = torch.arange(math.prod(outer), dtype=torch.int64).reshape(outer)
    # result[o * inner + i] = slice o's offset + layout[i], interleaving each dim as (outer, inner)
    full = slices.reshape([n for pair in zip(outer, [1] * len(outer)) for n in pair]) * per_slice + \
        layout.reshape([n for pair in zip([1] * len(inner), inner) for n in pair])
    return full.reshape([o * i for o, i in zip(outer, inner)])
