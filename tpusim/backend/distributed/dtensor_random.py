"""DTensor random ops on "tpu": each rank draws the whole tensor and keeps its shard.

Why: PyTorch's DTensor gives a sharded random op CUDA's answer by moving a Philox generator's (seed,
offset) to each shard's place in the whole tensor (torch/distributed/tensor/_random.py). The "tpu"
device's generator is CPU's (so a seeded program draws what CPU draws), and CPU's draws cannot skip
ahead: DTensor's offset arithmetic on its state fails, and with it every FSDP2 model built on the meta
device and initialised on "tpu" (torchtitan's way; TorchTPU's examples). Here a tpu mesh's random op
draws the whole tensor on the host from the device generator's state, the rank keeps its slice, and the
generator moves on as far as the whole draw: every rank's generator stays in step, and the sharded
initialisation equals the unsharded CPU one of the same seed, whatever the sharding.

The recorded op is the local one (what a TPU runs: each chip draws its shard); the whole draw happens on
host aliases, unrecorded. Without numerics (shape-only runs) there are no values to draw: the op runs
locally. A user's own ``generator=`` keeps DTensor's own path.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import ModuleType

import torch

from tpusim.backend.dispatch.dispatch_mode import DeviceDispatchMode
from tpusim.backend.plumbing.state import STATE


def install(random_module: ModuleType) -> None:
    """Make DTensor's default tracker class draw whole tensors on tpu meshes (other devices unchanged)."""
    base = random_module.OffsetBasedRNGTracker
    if getattr(base, "_tpusim", False):
        return

    class WholeDrawTracker(base):
        """DTensor's tracker; on a tpu mesh its region draws whole tensors (this module's docstring)."""

        _tpusim = True

        @contextlib.contextmanager
        def _distribute_region(self, spec: object, generator: torch.Generator | None = None) -> Iterator[None]:
            if self._device.type != "tpu" or generator is not None or not self.distribute_region_enabled:
                with super()._distribute_region(spec, generator):
                    yield
                return
            with _WholeDraw(spec):
                yield

    WholeDrawTracker.__name__ = WholeDrawTracker.__qualname__ = base.__name__
    random_module.OffsetBasedRNGTracker = WholeDrawTracker


def _shard_slices(spec: object) -> tuple[tuple[int, ...], tuple[slice, ...]]:
    """(the whole tensor's shape, this rank's slice of it) for a DTensor spec."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape = tuple(spec.shape)
    local, offset = compute_local_shape_and_global_offset(shape, spec.mesh, spec.placements)
    return shape, tuple(slice(o, o + n) for o, n in zip(offset, local, strict=True))


class _WholeDraw(DeviceDispatchMode):
    """While DTensor runs one random op on a local shard: run it, then overwrite the shard with its slice of
    the whole draw made from the same generator state."""

    def __init__(self, spec: object) -> None:
        super().__init__()
        self.shape, self.slices = _shard_slices(spec)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        if not STATE.numerics or torch.Tag.nondeterministic_seeded not in func.tags or _draws_from_tensors(args,
                                                                                                          kwargs):
            return func(*args, **kwargs)
        generator = STATE.default_generators[_device_index(args, kwargs)]
        before = generator.get_state()
        out = func(*args, **kwargs)
        target = out if isinstance(out, torch.Tensor) else None
        if target is None or target.device.type != "tpu" or tuple(target.shape) != _local_shape(self.slices):
            return out                     # not a draw of this shard's shape: keep the local draw
        whole, after = _draw_whole(func, args, kwargs, self.shape, target.dtype, before)
        STATE.shim.host_alias(target).copy_(whole[self.slices])
        generator.set_state(after)
        return out


def _draws_from_tensors(args: tuple, kwargs: dict) -> bool:
    """Whether the op reads tensors besides the one it fills (bernoulli's p, dropout's input): their whole
    values are on other ranks, so the local draw stands."""
    tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
    return len(tensors) > 1 or (len(tensors) == 1 and not (args and args[0] is tensors[0]))


def _local_shape(slices: tuple[slice, ...]) -> tuple[int, ...]:
    return tuple(s.stop - s.start for s in slices)


def _device_index(args: tuple, kwargs: dict) -> int:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor) and value.device.type == "tpu":
            return value.device.index or 0
    device = kwargs.get("device")
    return (torch.device(device).index or 0) if device is not None else 0


def _draw_whole(func: torch._ops.OpOverload, args: tuple, kwargs: dict, shape: tuple[int, ...],
                dtype: torch.dtype, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The op on a whole-shape CPU tensor drawn from ``state`` (CPU's default generator carries it, as the
    fallback does for every random op), and the generator state after it."""
    saved = torch.random.get_rng_state()
    torch.random.set_rng_state(state)
    try:
        if args and isinstance(args[0], torch.Tensor):           # an in-place draw into its first argument
            whole = torch.empty(shape, dtype=dtype)
            func(whole, *args[1:], **kwargs)
        else:                                                    # a factory: its first argument is the size
            whole = func(list(shape), *args[1:], **{**kwargs, "device": torch.device("cpu")})
        return whole, torch.random.get_rng_state()
    finally:
        torch.random.set_rng_state(saved)
