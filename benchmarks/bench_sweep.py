"""Sweep wall time on Dask with 1, 2 and 4 local workers over one >= 200-point grid, measured in one run.

    python benchmarks/bench_sweep.py                      # records examples/mlp.py once, then sweeps it
    python benchmarks/bench_sweep.py --report reports/gpt # sweep another recording (a `tpusim run --out` folder)

The grid: chips v4, v5p, v7 (3D) and v5e, v6e (2D) x 8 topologies (four 2D, four 3D) x slices 1, 2, 4, 8 x
modes strict, fused, debug = 480 points, of which the 384 whose torus the chip can form are priced (the
96 with a 3D topology on a 2D chip are rows with status invalid, found on the client without a task).
Each worker count gets a fresh LocalCluster; its start-up is timed apart from the sweep. Speed-up is the
1-worker sweep time over each; on a machine with fewer free cores than workers it cannot reach the
worker count.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tpusim.sweep import load_recording, sweep  # noqa: E402

GRID = dict(chips=("v4", "v5p", "v7", "v5e", "v6e"),
            topologies=("2d:2x2", "2d:4x4", "2d:8x8", "2d:16x16", "3d:2x2x2", "3d:2x2x4", "3d:4x4x4", "3d:4x4x8"),
            slices=(1, 2, 4, 8), modes=("strict", "fused", "debug"))


def record(folder: Path) -> Path:
    """examples/mlp.py run once by `tpusim run` (the recording every worker count prices)."""
    root = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-m", "tpusim", "run", str(root / "examples" / "mlp.py"), "--quiet",
                    "--out", str(folder)], check=True, stdout=subprocess.DEVNULL)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", help="a `tpusim run` folder to sweep (default: record examples/mlp.py)")
    parser.add_argument("--workers", default="1,2,4", help="worker counts, comma list (default 1,2,4)")
    args = parser.parse_args()
    from distributed import Client, LocalCluster

    with tempfile.TemporaryDirectory() as scratch:
        recording = load_recording(args.report or record(Path(scratch) / "run"))
        print(f"recording: {recording.script or recording.folder}, {len(recording.trace.records)} records; "
              f"{os.cpu_count()} CPUs")
        print(f"{'workers':>7} {'start-up s':>10} {'sweep s':>8} {'points':>6} {'priced':>6} {'points/s':>8} "
              f"{'speed-up':>8}")
        first = None
        for workers in (int(w) for w in args.workers.split(",")):
            began = time.perf_counter()
            with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None,
                              silence_logs=50) as cluster, Client(cluster) as client:
                client.wait_for_workers(workers)
                ready = time.perf_counter()
                table = sweep(recording, client=client, **GRID)
                wall = time.perf_counter() - ready
            first = first or wall
            priced = int((table["status"] == "ok").sum())
            print(f"{workers:>7} {ready - began:>10.1f} {wall:>8.1f} {len(table):>6} {priced:>6} "
                  f"{len(table) / wall:>8.1f} {first / wall:>7.2f}x")


if __name__ == "__main__":
    main()
