"""Simulator speed: a 1 GiB all-reduce over every chip of 64 .. 8960-chip v5p slices, and event rates.

    python benchmarks/bench_sim.py            # the table below, measured in one run
    python benchmarks/bench_sim.py --profile  # cProfile of the 4096-chip case, top functions

Goal (issue 3): <= 2 s wall at 4096 chips on 2 cores, growing sub-linearly with chips. What keeps
it small is symmetry (one representative line per torus axis), not raw event speed; the event
rate is printed so a regression in either shows. The 8960-chip pod (16x20x28) is larger than the
largest single v5p slice ``build_slice`` accepts (16x16x24), so it is built directly as a
wrapped torus (``Slice(...)``; the constructor trusts its input).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

import simpy

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tpusim.collectives import algorithm_cost, build_plan, simulate_collective  # noqa: E402
from tpusim.spec import load_chip  # noqa: E402
from tpusim.topology import Slice, build_slice  # noqa: E402

GIB = 2**30
SHAPES = [(4, 4, 4), (8, 8, 8), (16, 16, 16), (16, 20, 28)]


class _Counting:
    """Counts events scheduled on any simpy Environment while active (benchmark only)."""

    def __enter__(self):
        self.count = 0
        self._orig = simpy.Environment.schedule

        def schedule(env, event, priority=1, delay=0, _orig=self._orig):
            self.count += 1
            return _orig(env, event, priority, delay)

        simpy.Environment.schedule = schedule
        return self

    def __exit__(self, *exc):
        simpy.Environment.schedule = self._orig


def v5p_slice(dims: tuple[int, ...]) -> Slice:
    spec = "3d:" + "x".join(map(str, dims))
    chip = load_chip("v5p")
    if dims[0] * dims[1] * dims[2] <= 6144:
        return build_slice(spec, chip=chip)
    return Slice(spec=spec, dims=dims, wrap=(True, True, True), twisted=False, chip=chip)


def _clear_caches() -> None:
    build_plan.cache_clear()
    algorithm_cost.cache_clear()
    from tpusim.collectives import _choose
    from tpusim.collectives.groups import _group_axes

    _choose.cache_clear()
    _group_axes.cache_clear()


def bench_all_reduce() -> None:
    print("all-reduce of 1 GiB over every chip of a v5p slice (cold caches; wall = choose + plan + DES)")
    print(f"{'slice':>12} {'chips':>6} {'algorithm':>11} {'DES time':>10} {'closed form':>12} "
          f"{'wall s':>7} {'events':>7} {'events/s':>9}")
    for dims in SHAPES:
        s = v5p_slice(dims)
        _clear_caches()
        with _Counting() as counter:
            t0 = time.perf_counter()
            r = simulate_collective(s, "all_reduce", GIB)
            wall = time.perf_counter() - t0
        print(f"{'x'.join(map(str, dims)):>12} {s.num_chips:>6} {r.algorithm:>11} {r.time_s * 1e3:>8.3f}ms "
              f"{r.closed_form_s * 1e3:>10.3f}ms {wall:>7.3f} {counter.count:>7} {counter.count / wall:>9.0f}")


def bench_without_symmetry() -> None:
    """The same all-reduce forced onto algorithms that symmetry helps less (or not at all)."""
    s = v5p_slice((16, 16, 16))
    print("\n1 GiB all-reduce on 16x16x16, algorithm forced")
    for name in ("hierarchical", "bidi_ring"):
        _clear_caches()
        with _Counting() as counter:
            t0 = time.perf_counter()
            r = simulate_collective(s, "all_reduce", GIB, algorithm=name)
            wall = time.perf_counter() - t0
        print(f"  {name:>12}: DES {r.time_s * 1e3:8.3f} ms, closed form {r.closed_form_s * 1e3:8.3f} ms, "
              f"wall {wall:.3f} s, {counter.count} events ({r.simulated})")


def bench_network_event_rate() -> None:
    """Raw DES speed where symmetry does not help: a one-shot all-to-all on 4x4x4 (4032 flows)."""
    s = v5p_slice((4, 4, 4))
    _clear_caches()
    with _Counting() as counter:
        t0 = time.perf_counter()
        simulate_collective(s, "all_to_all", 64 * 2**20, algorithm="direct")
        wall = time.perf_counter() - t0
    print(f"\nnetwork DES, one-shot all-to-all of 64 MiB on 4x4x4 (4032 routed flows): "
          f"{counter.count} events in {wall:.2f} s = {counter.count / wall:,.0f} events/s")


def bench_engine_event_rate() -> None:
    """The engine replaying a synthetic SPMD training step: ops and an overlapping gradient all-reduce."""
    from tpusim.engine import simulate
    from tpusim.trace import CollectiveRecord, OpRecord, StepMarker, TensorMeta, Trace, renumber

    def t(i):
        return TensorMeta(id=i, shape=(1024, 1024), dtype="bfloat16", nbytes=2 * 2**20, storage=i)

    records = []
    for step in range(20):
        for i in range(200):
            records.append(OpRecord(seq=0, op="aten::mm", unit="mxu", dtype="bfloat16", flops=2 * 1024**3,
                                    matmul=(1, 1024, 1024, 1024),
                                    bytes_read=4 * 2**20, bytes_written=2 * 2**20,
                                    inputs=(t(i),), outputs=(t(i + 1),)))
        records.append(CollectiveRecord(seq=0, collective="all_reduce", bytes=256 * 2**20, async_op=True,
                                        inputs=(t(1000 + step),), outputs=(t(1000 + step),)))
        records.append(StepMarker(seq=0, step=step))
    s = v5p_slice((8, 8, 8))
    trace = Trace(records=renumber(records), world_size=s.num_chips)
    _clear_caches()
    with _Counting() as counter:
        t0 = time.perf_counter()
        tl = simulate(trace, s)
        wall = time.perf_counter() - t0
    print(f"engine, 20 steps x (200 matmuls + 256 MiB async all-reduce) on 8x8x8: {len(records)} records, "
          f"{counter.count} events in {wall:.2f} s = {counter.count / wall:,.0f} events/s "
          f"(simulated {tl.total_s * 1e3:.1f} ms)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", action="store_true", help="profile the 4096-chip all-reduce")
    args = parser.parse_args()
    if args.profile:
        s = v5p_slice((16, 16, 16))
        _clear_caches()
        prof = cProfile.Profile()
        prof.runcall(simulate_collective, s, "all_reduce", GIB)
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)
        return 0
    bench_all_reduce()
    bench_without_symmetry()
    bench_network_event_rate()
    try:
        bench_engine_event_rate()
    except Exception as error:  # the engine is developed beside this module; report, don't hide
        print(f"engine event rate: not measured ({type(error).__name__}: {error})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
