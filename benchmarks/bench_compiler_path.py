"""What the TPU compiler path costs a user in wall time, next to the model path (issue 41 item 4).

    python benchmarks/bench_compiler_path.py [--cases mlp,transformer] [--repeat 1]

For each small example script, runs ``tpusim run <script> --mode all --numerics off`` three ways and prints
their wall times side by side:

- **model**: ``--compiler model`` (tpusim's own model of XLA; no compiler);
- **xla cold**: ``--compiler xla`` with an empty compile cache (XDG_CACHE_HOME in a fresh temporary folder):
  every distinct program (eager op, Fused cluster, torch.compile graph) is compiled;
- **xla warm**: the same again with the cache the cold run filled: nothing is compiled.

Then the ratios to the model path (goal: warm within 1.5x, cold within 3x), how many programs the cold run
compiled and in how long (its "XLA: compiled N programs in S s" line), and whether the warm run priced the
same step times as the cold one. ``--repeat N`` keeps the fastest of N runs of each (a fresh cache for each cold
run). Needs the xla extra (pip install -e ".[xla]").
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = {  # name -> (script, its flags)
    "mlp": ("mlp.py", []),
    "transformer": ("transformer.py", []),
}
GOAL_WARM, GOAL_COLD = 1.5, 3.0


@dataclass
class Run:
    wall_s: float
    steps: dict[str, float]            # mode -> median step time
    stderr: str


def run(script: str, flags: list[str], compiler: str, cache: Path, out: Path) -> Run:
    """One ``tpusim run`` of the example, timed from the outside (what the user waits)."""
    command = [sys.executable, "-m", "tpusim", "run", str(ROOT / "examples" / script), "--mode", "all",
               "--numerics", "off", "--compiler", compiler, "--out", str(out), "--", *flags]
    began = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "XDG_CACHE_HOME": str(cache)})
    wall = time.perf_counter() - began
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    modes = json.loads((out / "report.json").read_text())["modes"]
    return Run(wall, {name: mode["step_time_median_s"] for name, mode in modes.items()}, done.stderr)


def fastest(runs: list[Run]) -> Run:
    return min(runs, key=lambda r: r.wall_s)


def measure(name: str, repeat: int, folder: Path) -> dict:
    """The case's model, cold and warm runs (the fastest of ``repeat`` each)."""
    script, flags = CASES[name]
    model = fastest([run(script, flags, "model", folder / f"model-cache-{i}", folder / "out") for i in range(repeat)])
    colds, warms = [], []
    for i in range(repeat):
        cache = folder / f"{name}-cache-{i}"               # empty: every program compiles
        colds.append(run(script, flags, "xla", cache, folder / "out"))
        warms.append(run(script, flags, "xla", cache, folder / "out"))
    cold, warm = fastest(colds), fastest(warms)
    said = re.search(r"XLA: compiled (\d+) programs? in ([\d.]+) s", cold.stderr)
    return {"name": name, "model": model, "cold": cold, "warm": warm,
            "compiled": (int(said.group(1)), float(said.group(2))) if said else None,
            "warm_compiled": "XLA: compiling" in warm.stderr}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--repeat", type=int, default=1, help="keep the fastest of N runs of each")
    args = parser.parse_args()
    names = [n.strip() for n in args.cases.split(",") if n.strip()]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        sys.exit(f"--cases {','.join(unknown)}: not a case; accepted: {', '.join(CASES)}")
    with tempfile.TemporaryDirectory(prefix="tpusim-bench-compiler-") as folder:
        rows = [measure(name, max(1, args.repeat), Path(folder)) for name in names]
    print(f"tpusim run <example> --mode all --numerics off: wall time, {os.cpu_count()} cores"
          + (" (PYTHONDONTWRITEBYTECODE is set: every process compiles its imports from source)"
             if os.environ.get("PYTHONDONTWRITEBYTECODE") else ""))
    print(f"{'case':<12} {'model':>8} {'xla cold':>9} {'xla warm':>9} {'cold/model':>11} {'warm/model':>11}")
    for row in rows:
        model, cold, warm = row["model"].wall_s, row["cold"].wall_s, row["warm"].wall_s
        print(f"{row['name']:<12} {model:>7.1f}s {cold:>8.1f}s {warm:>8.1f}s {cold / model:>10.2f}x "
              f"{warm / model:>10.2f}x")
    print(f"goal: cold within {GOAL_COLD:g}x, warm within {GOAL_WARM:g}x of the model path")
    for row in rows:
        compiled = (f"{row['compiled'][0]} programs compiled in {row['compiled'][1]:.1f} s"
                    if row["compiled"] else "nothing compiled")
        same = row["cold"].steps == row["warm"].steps
        print(f"  {row['name']}: cold run: {compiled}; warm run: "
              f"{'compiled again (a cache miss)' if row['warm_compiled'] else 'nothing compiled'}, "
              f"{'the same' if same else 'OTHER'} step times as the cold run")


if __name__ == "__main__":
    main()
