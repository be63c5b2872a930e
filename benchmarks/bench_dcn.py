"""DCN pricing speed: one multislice all-reduce (ICI reduce-scatter, DCN all-reduce of the shard,
ICI all-gather) priced on 2 x 8 v7 chips and on 12 x 9216 (110,592 chips), side by side in one run.

    python benchmarks/bench_dcn.py

The DCN stage is priced per host block and played for one chip position, never per chip, so the
closed form costs the same at any size and the DES grows only with the slice count and the ICI
stages' representative lines. Goal: the 110,592-chip collective in well under a second (a whole
program at that size is priced in <= 60 s); the ratio column shows how pricing time grows with
the chip count (110,592 / 16 = 6912x more chips).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tpusim.network.collectives import closed_form_time, simulate_collective  # noqa: E402
from tpusim.slice.topology import build_slice  # noqa: E402

CASES = (("3d:2x2x2", 2), ("3d:16x24x24", 12))      # (slice, slices) on v7
NBYTES = 1e9


def _timed(fn):
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def main() -> None:
    rows = []
    for spec, slices in CASES:
        s = build_slice(spec, chip="v7", slices=slices)
        chips = s.num_chips * s.num_slices
        closed, t_closed = _timed(lambda s=s: closed_form_time(s, "all_reduce", NBYTES))
        des, t_des = _timed(lambda s=s: simulate_collective(s, "all_reduce", NBYTES))
        rows.append((chips, f"{spec} x {slices}", closed, t_closed, des, t_des))
    base = rows[0]
    print(f"{'chips':>8}  {'slice':<22}{'priced':>10}  {'closed form':>12}  {'x':>6}  {'DES':>9}  {'x':>6}  DES plan")
    for chips, label, closed, t_closed, des, t_des in rows:
        print(f"{chips:>8}  {label:<22}{closed * 1e3:>8.2f}ms  {t_closed * 1e3:>10.2f}ms  {t_closed / base[3]:>6.1f}"
              f"  {t_des:>8.3f}s  {t_des / base[5]:>6.1f}  {des.simulated}")


if __name__ == "__main__":
    main()
