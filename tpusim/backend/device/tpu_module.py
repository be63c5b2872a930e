"""``torch.tpu``: the device module, mirroring ``torch.cuda`` where that makes sense, and TorchTPU's ``torch.tpu``.

Devices, streams and events, random-number state, memory statistics (of the simulated HBM) and
AMP support. Registered by tpusim/backend/device/registration.py with ``torch._register_device_module("tpu", ...)``.
TorchTPU's names (its public ``torch.tpu`` table) come from tpusim/backend/torchtpu/, one module per group:
``EagerMode``, the settable ``eager_mode`` and ``set_eager_mode`` (modes.py), ``Precision``,
``precision`` and the settable ``allow_excess_precision`` (precision.py), ``topology_aware_mesh``
and ``get_local_device_attributes`` (hardware.py), the compile-cache telemetry ``_get_cache_stats``
and friends and ``_hbm_usage_summary`` (cache.py), the settable ``window_num_stripes`` /
``window_stripe_chunk_mb`` (distributed/); ``torch.tpu.distributed``, ``torch.tpu.compiler`` and
``torch.tpu.ops`` are those subpackages (tpusim/backend/torchtpu/__init__.py ``install``).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import Any, NamedTuple

import torch

from tpusim.backend.plumbing.state import STATE
from tpusim.backend.program_trace import recorder
from tpusim.backend.torchtpu import cache, hardware, modes, unsupported
from tpusim.backend.torchtpu import distributed as _tpu_distributed
from tpusim.backend.torchtpu import precision as precision_module

_device_t = torch.device | str | int | None


# ---------------------------------------------------------------- devices

def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def init() -> None:
    """Nothing to do: the device is ready once tpusim.backend is imported."""


def _lazy_init() -> None:
    pass


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    return STATE.shim.device_count()


def current_device() -> int:
    return STATE.shim.current_device()


def _index(device: _device_t) -> int:
    if device is None:
        return current_device()
    if isinstance(device, int):
        return device
    d = torch.device(device)
    if d.type != "tpu":
        raise ValueError(f"tpusim: expected a tpu device, got {d}")
    return d.index if d.index is not None else current_device()


def _exchange_device(device: int) -> int:
    """Make ``device`` current and return the one that was (-1 leaves it): torch's device context managers
    (``torch.tpu.device``, ``torch.accelerator.device_index``) switch through this, as through CUDA's."""
    previous = current_device()
    if device >= 0:
        set_device(device)
    return previous


_maybe_exchange_device = exchange_device = _exchange_device


def set_device(device: _device_t) -> None:
    index = _index(device)
    if index >= 0:
        STATE.shim.set_device(index)


class device:
    """Context manager that makes ``device`` current (like torch.cuda.device)."""

    def __init__(self, device: _device_t) -> None:
        self.idx = _index(device) if device is not None else -1
        self.prev = -1

    def __enter__(self) -> None:
        self.prev = current_device()
        if self.idx >= 0:
            set_device(self.idx)

    def __exit__(self, *exc: object) -> bool:
        if self.idx >= 0:
            set_device(self.prev)
        return False


class device_of(device):
    """Context manager that makes the device of tensor ``obj`` current."""

    def __init__(self, obj: torch.Tensor) -> None:
        super().__init__(obj.get_device() if obj.device.type == "tpu" else None)


class _Properties(NamedTuple):
    name: str
    chip: str
    total_memory: int
    multi_processor_count: int


def get_device_name(device: _device_t = None) -> str:
    """The simulated chip as TorchTPU names it, e.g. "TPU v5p", "TPU v7"."""
    return STATE.config.chip.display_name


def get_device_properties(device: _device_t = None) -> _Properties:
    """Name, chip, HBM per device (``total_memory``: half a chip's on v7, as TorchTPU reports) and one
    multiprocessor, as TorchTPU's ``_TpuDeviceProperties`` (which has no ``chip``)."""
    _index(device)
    cfg = STATE.config
    return _Properties(cfg.chip.display_name, cfg.chip.name, cfg.hbm_bytes, 1)


def get_local_device_attributes() -> dict[str, object]:
    """The current device's place on the simulated slice (TorchTPU: its PJRT device attributes)."""
    return hardware.local_device_attributes()


def get_eager_mode() -> modes.EagerMode:
    """The active eager mode as TorchTPU's ``EagerMode`` member (TorchTPU's execution_mode.get_eager_mode); a member
    is also its tpusim name: ``torch.tpu.get_eager_mode() == "strict"``."""
    return modes.get_eager_mode()


# TorchTPU's names (tpusim/backend/torchtpu/)
EagerMode = modes.EagerMode
set_eager_mode = modes.set_eager_mode
Precision = precision_module.Precision
precision = precision_module.precision
topology_aware_mesh = hardware.topology_aware_mesh
_get_cache_stats = cache.get_cache_stats
_get_cache_requests = cache.get_cache_requests
_get_cache_hits = cache.get_cache_hits
_get_cache_misses = cache.get_cache_misses
_clear_cache = cache.clear_cache
_hbm_usage_summary = cache.hbm_usage_summary
_set_dump_on_cache_miss = cache.set_dump_on_cache_miss
_get_dump_on_cache_miss = cache.get_dump_on_cache_miss


def synchronize(device: _device_t = None) -> None:
    """Wait for the device: execution is synchronous, so only the recorder notes the sync."""
    if STATE.recording:
        recorder.record_host("sync", "synchronize")


# ---------------------------------------------------------------- streams and events

class Stream(torch.Stream):
    """A tpu stream (work is synchronous on the simulator target; streams exist for API parity)."""

    def __new__(cls, device: _device_t = None, priority: int = 0, **kwargs: Any) -> Stream:
        if "stream_id" in kwargs:
            return super().__new__(cls, **kwargs)
        return super().__new__(cls, device=torch.device("tpu", _index(device)), priority=priority)


class Event:
    """A tpu event (a plain ``torch.Event`` on the tpu device, which torch's C++ side requires):
    it records a timestamp, so ``elapsed_time`` measures host wall time."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> torch.Event:
        return torch.Event(device=torch.device("tpu", current_device()), enable_timing=enable_timing,
                           blocking=blocking, interprocess=interprocess)


def current_stream(device: _device_t = None) -> torch.Stream:
    return torch._C._accelerator_getStream(_index(device))


def default_stream(device: _device_t = None) -> torch.Stream:
    """Stream 0 of the device (torch.Stream wants the device type as its number: PrivateUse1's)."""
    index = _index(device)
    return torch.Stream(stream_id=0, device_index=index, device_type=current_stream(index).device_type)


def set_stream(stream: torch.Stream) -> None:
    if stream is not None:
        torch._C._accelerator_setStream(stream)


@contextlib.contextmanager
def stream(s: torch.Stream | None) -> Iterator[None]:
    """Make ``s`` the current stream of its device inside the block."""
    if s is None:
        yield
        return
    prev = current_stream(s.device_index)
    set_stream(s)
    try:
        yield
    finally:
        set_stream(prev)


# ---------------------------------------------------------------- random numbers


def __getattr__(name: str) -> object:
    """``torch.tpu.default_generators``: the device's generators (``STATE``, set at registration); TorchTPU
    names that cannot run here (tpusim/backend/torchtpu/unsupported.py)."""
    if name == "default_generators":
        return STATE.default_generators
    found = unsupported.stand_in("torch.tpu", name)
    if found is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return found


def _gen(device: _device_t) -> torch.Generator:
    return STATE.default_generators[_index(device)]


def manual_seed(seed: int) -> None:
    _gen(None).manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for g in STATE.default_generators:
        g.manual_seed(int(seed))


def seed() -> None:
    _gen(None).seed()


def seed_all() -> None:
    s = _gen(None).seed()
    for g in STATE.default_generators:
        g.manual_seed(s)


def initial_seed() -> int:
    return _gen(None).initial_seed()


def get_rng_state(device: _device_t = "tpu") -> torch.Tensor:
    return _gen(device).get_state()


def set_rng_state(new_state: torch.Tensor, device: _device_t = "tpu") -> None:
    _gen(device).set_state(new_state.cpu())


def get_rng_state_all() -> list[torch.Tensor]:
    return [g.get_state() for g in STATE.default_generators]


def set_rng_state_all(new_states: list[torch.Tensor]) -> None:
    for g, s in zip(STATE.default_generators, new_states, strict=False):
        g.set_state(s.cpu())


# ---------------------------------------------------------------- memory (simulated HBM)

def memory_stats(device: _device_t = None) -> dict[str, int]:
    """CUDA-style keys over the device's simulated HBM (no caching: reserved == allocated)."""
    s = STATE.shim.stats(_index(device))
    return {
        "allocated_bytes.all.current": s["allocated_bytes"],
        "allocated_bytes.all.peak": s["peak_bytes"],
        "allocated_bytes.all.allocated": s["allocated_bytes_total"],
        "reserved_bytes.all.current": s["allocated_bytes"],
        "reserved_bytes.all.peak": s["peak_bytes"],
        "allocation.all.current": s["live_blocks"],
        "allocation.all.allocated": s["allocations"],
        "allocation.all.freed": s["frees"],
        "num_alloc_retries": 0,
        "num_ooms": 0,
        "hbm_capacity_bytes": STATE.config.hbm_bytes,
    }


def memory_allocated(device: _device_t = None) -> int:
    return STATE.shim.stats(_index(device))["allocated_bytes"]


def max_memory_allocated(device: _device_t = None) -> int:
    return STATE.shim.stats(_index(device))["peak_bytes"]


memory_reserved = memory_allocated
max_memory_reserved = max_memory_allocated


def reset_peak_memory_stats(device: _device_t = None) -> None:
    STATE.shim.reset_peak(_index(device))


reset_max_memory_allocated = reset_peak_memory_stats


def mem_get_info(device: _device_t = None) -> tuple[int, int]:
    """(free, total) bytes of the simulated HBM; total is the chip's capacity (0 = unlimited)."""
    total = STATE.config.hbm_bytes
    return max(total - memory_allocated(device), 0), total


def empty_cache() -> None:
    """No caching allocator: freed memory is returned at once."""


# ---------------------------------------------------------------- AMP

# TorchTPU's list (torch_tpu/_internal/device/_device_module.py _AMP_SUPPORTED_DTYPES): the dtypes autocast accepts
_AMP_DTYPES = (torch.bfloat16, torch.bool, torch.complex128, torch.complex64, torch.float16, torch.float32,
               torch.float64, torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2, torch.float8_e5m2fnuz,
               torch.float8_e8m0fnu, torch.int16, torch.int32, torch.int64, torch.int8, torch.uint16, torch.uint32,
               torch.uint64, torch.uint8)


def get_amp_supported_dtype() -> list[torch.dtype]:
    """The dtypes ``torch.autocast("tpu", dtype=...)`` accepts: TorchTPU's list (bfloat16 is the TPU's native
    low-precision type and autocast's default here)."""
    return list(_AMP_DTYPES)


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


# TorchTPU's device-module autocast hooks, over torch's own autocast state for "tpu"
def _is_autocast_enabled() -> bool:
    return torch.is_autocast_enabled("tpu")


def _get_autocast_dtype() -> torch.dtype:
    return torch.get_autocast_dtype("tpu")


def _set_autocast_enabled(enabled: bool) -> None:
    torch.set_autocast_enabled("tpu", bool(enabled))


def _set_autocast_dtype(dtype: torch.dtype) -> None:
    if dtype not in _AMP_DTYPES:
        raise ValueError(f"Unsupported dtype {dtype} for AMP. Supported dtypes are: {get_amp_supported_dtype()}")
    torch.set_autocast_dtype("tpu", dtype)


class _TpuModule(ModuleType):
    """``torch.tpu``'s settable attributes, as TorchTPU's device module has them (properties of its class)."""

    eager_mode = property(lambda self: modes.get_eager_mode(), lambda self, value: modes.set_global_eager_mode(value),
                          doc="The active eager mode as a torch.tpu.EagerMode member; assign one to switch.")
    allow_excess_precision = property(lambda self: precision_module.get_allow_excess_precision(),
                                      lambda self, value: precision_module.set_allow_excess_precision(value))
    window_num_stripes = property(lambda self: _tpu_distributed.get_window_num_stripes(),
                                  lambda self, value: _tpu_distributed.set_window_num_stripes(value))
    window_stripe_chunk_mb = property(lambda self: _tpu_distributed.get_window_stripe_chunk_mb(),
                                      lambda self, value: _tpu_distributed.set_window_stripe_chunk_mb(value))


sys.modules[__name__].__class__ = _TpuModule
