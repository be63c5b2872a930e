"""The TPU compiler in the loop (tpusim/xla/): what a user waits, first run against cached, side by side.

    python benchmarks/bench_xla.py [--chip v5p] [--layers 2] [--d-model 1024]

Runs ``tpusim run examples/transformer.py --compiler xla -- --compile`` twice with one fresh compile cache
(XDG_CACHE_HOME in a temporary folder): the first run compiles every graph, the second finds them all
cached; then once with ``--compiler model``. Prints the wall times and their ratio, the compile time of
each graph, the compiled programs priced three ways (tpusim on XLA's kernels, XLA's own estimate,
tpusim's model without the compiler) and the step time with and without the compiler. Needs the xla
extra (pip install -e ".[xla]").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(args: argparse.Namespace, out: Path, cache: Path, compiler: str = "xla") -> tuple[float, dict, str]:
    command = [sys.executable, "-m", "tpusim", "run", str(ROOT / "examples" / "transformer.py"), "--chip", args.chip,
               "--numerics", "off", "--compiler", compiler, "--quiet", "--out", str(out), "--",
               "--compile", "--layers", str(args.layers), "--d-model", str(args.d_model), "--heads", str(args.heads),
               "--seq", str(args.seq), "--batch", str(args.batch), "--steps", "2"]
    began = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "XDG_CACHE_HOME": str(cache)})
    wall = time.perf_counter() - began
    if done.returncode != 0:
        sys.exit(f"tpusim run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return wall, json.loads((out / "report.json").read_text()), done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chip", default="v5p")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--d-model", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        cache = Path(folder) / "cache"
        first_s, report, stdout = run(args, Path(folder) / "first", cache)
        cached_s, _, _ = run(args, Path(folder) / "cached", cache)
        _, model, _ = run(args, Path(folder) / "model", cache, "model")
        compiles = sorted(json.loads(p.read_text())["compile_s"] for p in (cache / "tpusim" / "xla").glob("*.json"))
    mode = report["modes"]["strict"]
    xla = mode["xla"]
    print(f"transformer ({args.layers} layers, d_model {args.d_model}, seq {args.seq}, batch {args.batch}) "
          f"on {args.chip}, --compiler xla")
    print(f"  wall, empty compile cache: {first_s:8.1f} s")
    print(f"  wall, every graph cached:  {cached_s:8.1f} s   (ratio {first_s / cached_s:.2f}x)")
    print(f"  compiles: {len(compiles)} graphs, {', '.join(f'{s:.1f} s' for s in compiles)}")
    print(f"  compiled programs, strict mode, {xla['executions']} executions ({xla['fusions']} fusions, "
          f"{xla['kernels']} kernels run): tpusim on XLA's kernels {xla['priced_s'] * 1e3:.3f} ms, XLA's own "
          f"estimate {xla['estimated_s'] * 1e3:.3f} ms, tpusim's model {xla['model_s'] * 1e3:.3f} ms; "
          f"HBM peak {xla['hbm_peak_bytes'] / 2**20:.1f} MiB")
    step_xla, step_model = mode["step_time_median_s"], model["modes"]["strict"]["step_time_median_s"]
    print(f"  step time, strict: {step_xla * 1e3:.3f} ms with the compiler, {step_model * 1e3:.3f} ms without "
          f"(ratio {step_xla / step_model:.2f})")
    print("  fell back: " + ("; ".join(xla["fell_back"]) or "none"))
    print("\n".join(line for line in stdout.splitlines() if line.startswith("TPU compiler")))

if __name__ == "__main__":
    main()
