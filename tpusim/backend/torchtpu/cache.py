"""TorchTPU's compile-cache telemetry: ``torch.tpu._get_cache_stats()`` and friends, fed by the live caches.

    stats = torch.tpu._get_cache_stats()
    stats.num_cache_reqs, stats.num_cache_hits         # lookups, and those that found a compiled executable
    for e in stats.per_entry_stats:                     # one per compiled executable
        e.key, e.read_count, e.last_read, e.compilation_duration

The same fields as TorchTPU's ``PerfStats`` (its csrc/common/compilation_cache.h): a request is one lookup
of a compiled executable, a hit one that found it, and each entry counts its hits (``read_count``).
What feeds it here, the caches that really compile in this process:

- torch.compile graphs (tpusim/backend/torch_compile/jax_backend.py): each execution of a graph is a request keyed
  by the graph and its input shapes; a miss compiles (jax.jit) and the entry keeps how long that took;
- eager ops on the simulator target (tpusim/backend/csrc/compile_cache.cpp): each op the device runs is a
  request keyed by the op, its tensors' dtypes and shapes and its integer arguments, as TorchTPU keys an
  eager executable; the first of a key is a miss. Nothing is compiled, so its entries' compilation time is
  zero (the report prices compiles). Under Fused eager TorchTPU looks up whole clusters; here each op still
  counts once (a departure: the report's compile cache prices clusters);
- the PJRT target (tpusim/backend/targets/pjrt.py), when it is used: each jitted computation run is a request and
  each one built a miss (``pjrt.stats()``: executions, compiles); its entries are counted, not listed, and
  stand in for the eager counts (the same ops, really compiled).

``_clear_cache()`` evicts every entry (the next execution compiles again); the counters keep counting, as
TorchTPU's do.
``_hbm_usage_summary()`` speaks of the simulated HBM.
"""

from __future__ import annotations

import datetime as dt
import sys
from dataclasses import dataclass, field

from tpusim.backend.plumbing.state import STATE

_PJRT = "tpusim.backend.targets.pjrt"


@dataclass
class CacheEntryStats:
    """One compiled executable (TorchTPU's ``CacheEntryStats`` with its ``key``)."""

    key: str                                    # what it is specialised on: the graph and its input shapes
    compilation_duration: dt.timedelta          # how long compiling it took
    last_read: dt.datetime | None = None        # the last hit (None: never hit yet)
    read_count: int = 0                         # hits


@dataclass
class PerfStats:
    """The cache's figures (TorchTPU's ``PerfStats``): misses = ``num_cache_reqs - num_cache_hits``."""

    num_cache_reqs: int = 0
    num_cache_hits: int = 0
    per_entry_stats: list[CacheEntryStats] = field(default_factory=list)
    peak_compilation_host_memory_bytes: int | None = None   # not measured here (unknown, as TorchTPU says)

    @property
    def num_cache_misses(self) -> int:
        return self.num_cache_reqs - self.num_cache_hits

    def __str__(self) -> str:
        share = f"{100.0 * self.num_cache_hits / self.num_cache_reqs:.1f}%" if self.num_cache_reqs else "n/a"
        lines = [f"num_cache_reqs={self.num_cache_reqs}", f"num_cache_hits={self.num_cache_hits} {{{share}}}",
                 "peak_compilation_memory_bytes=unknown"]
        if self.per_entry_stats:
            total = sum((e.compilation_duration for e in self.per_entry_stats), dt.timedelta())
            lines += [f"num_compilation_events={len(self.per_entry_stats)}",
                      f"sum_compilation_time={total.total_seconds() * 1e3:.0f}ms"]
        return "\n".join(lines) + "\n"


class _Live:
    entries: dict[str, CacheEntryStats] = {}
    requests = 0
    hits = 0
    dump_on_miss = False


_LIVE = _Live()


def lookup(key: str) -> bool:
    """One request for the executable ``key``; True on a hit (the caller then runs it without compiling)."""
    _LIVE.requests += 1
    entry = _LIVE.entries.get(key)
    if entry is None:
        return False
    _LIVE.hits += 1
    entry.read_count += 1
    entry.last_read = dt.datetime.now()
    return True


def compiled(key: str, seconds: float) -> None:
    """The executable ``key`` was compiled after a miss, in ``seconds``."""
    _LIVE.entries[key] = CacheEntryStats(key, dt.timedelta(seconds=seconds))


def _pjrt_counts() -> tuple[int, int]:
    """(requests, hits) of the PJRT target since ``pjrt.reset_stats()``; (0, 0) when it was never loaded."""
    pjrt = sys.modules.get(_PJRT)
    if pjrt is None:
        return 0, 0
    stats = pjrt.stats()
    return stats.executions, max(stats.executions - stats.compiles, 0)


def _eager_counts() -> tuple[int, int, list[CacheEntryStats]]:
    """(requests, hits, entries) of eager ops (the shim's counters), or the PJRT target's while it is the target."""
    if getattr(STATE.target, "name", "") == "pjrt":
        return (*_pjrt_counts(), [])
    requests, hits, entries = STATE.shim.eager_cache()
    return requests, hits, [CacheEntryStats(label, dt.timedelta(0),
                                            dt.datetime.fromtimestamp(last) if reads else None, reads)
                            for label, reads, last in entries]


def get_cache_stats() -> PerfStats:
    """``torch.tpu._get_cache_stats()`` (see the module docstring)."""
    requests, hits, eager_entries = _eager_counts()
    return PerfStats(num_cache_reqs=_LIVE.requests + requests, num_cache_hits=_LIVE.hits + hits,
                     per_entry_stats=[*eager_entries,
                                      *(CacheEntryStats(e.key, e.compilation_duration, e.last_read, e.read_count)
                                        for e in _LIVE.entries.values())])


def get_cache_requests() -> int:
    return get_cache_stats().num_cache_reqs


def get_cache_hits() -> int:
    return get_cache_stats().num_cache_hits


def get_cache_misses() -> int:
    return get_cache_stats().num_cache_misses


def clear_cache() -> None:
    """Evict every compiled executable: the next execution of each compiles again (counters keep counting)."""
    _LIVE.entries.clear()
    STATE.shim.eager_cache_clear()
    jax = sys.modules.get("jax")
    if jax is not None:
        jax.clear_caches()         # the jitted functions' own executables, torch.compile's and the PJRT target's


def set_dump_on_cache_miss(enable: bool = True) -> None:
    """``torch.tpu._set_dump_on_cache_miss``: TorchTPU dumps libtpu's StableHLO on a miss. The flag is kept (and
    read back by ``_get_dump_on_cache_miss``); tpusim writes StableHLO where ``TPUSIM_DUMP_STABLEHLO=<dir>``
    points (torch.compile graphs) and through torch.compile's ``debug_callback``."""
    _LIVE.dump_on_miss = bool(enable)


def get_dump_on_cache_miss() -> bool:
    return _LIVE.dump_on_miss


def hbm_usage_summary() -> str:
    """``torch.tpu._hbm_usage_summary()``: TorchTPU's line about the cache's executables, then each device's
    simulated HBM (allocated, peak, capacity)."""
    cfg = STATE.config
    parts = [f"CompilationCache HBM usage: {_bytes(0)} for {len(_LIVE.entries)} executables "
             f"(executable code is not simulated)."]
    for index in range(STATE.shim.device_count()):
        s = STATE.shim.stats(index)
        capacity = _bytes(cfg.hbm_bytes) if cfg.hbm_bytes else "unlimited"
        parts.append(f"tpu:{index} HBM ({cfg.chip.display_name}, simulated): {_bytes(s['allocated_bytes'])} "
                     f"allocated, peak {_bytes(s['peak_bytes'])}, capacity {capacity}.")
    return " ".join(parts)


def _bytes(n: int) -> str:
    """tsl's HumanReadableNumBytes style: 0B, 512B, 1.50KiB, 95.00GiB."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)}{unit}" if unit == "B" else f"{value:.2f}{unit}"
        value /= 1024
    return f"{n}B"
