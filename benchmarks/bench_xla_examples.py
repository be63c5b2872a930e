"""The bundled examples that use torch.compile, priced with and without the TPU compiler, side by side.

    python benchmarks/bench_xla_examples.py [--skip-175b]

Each case runs ``tpusim run ... --mode strict`` twice: ``--compiler model`` (tpusim's own fusion and
schedule) and ``--compiler xla`` (XLA's kernels and schedule priced by tpusim), and prints the median step
time of each, a third step time with XLA's own estimate of its kernels in place of tpusim's (the step less
tpusim's price of the compiled programs plus XLA's, per step: it assumes the programs are on the critical
path), and the compile time of the case's graphs (first run, then from the cache). The compile cache is the
user's own (~/.cache/tpusim/xla): delete it to see first-run times. Needs the xla extra.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GPT3_SMALL = ["--layers", "2", "--d-model", "1024", "--heads", "16", "--seq", "1024", "--vocab", "32000",
              "--dtype", "bfloat16", "--batch", "2", "--tp", "4"]
CASES = {  # name -> (script, tpusim flags, script flags)
    "transformer --compile, 1 chip": ("transformer.py", ["--numerics", "off"],
                                      ["--compile", "--layers", "2", "--d-model", "1024", "--heads", "8",
                                       "--seq", "512", "--batch", "8", "--steps", "3"]),
    "gpt3 (2 layers, d 1024, TP 4), 3d:2x2x4": ("gpt3.py", ["--topology", "3d:2x2x4", "--numerics", "off"], GPT3_SMALL),
    "gpt3 175B int8 + checkpoint, 3d:8x8x8": ("gpt3.py", ["--topology", "3d:8x8x8", "--numerics", "off"],
                                              ["--preset", "175b", "--int8", "--checkpoint"]),
}


def run(script: str, flags: list[str], script_flags: list[str], compiler: str, out: Path) -> tuple[dict, float]:
    command = [sys.executable, "-m", "tpusim", "run", str(ROOT / "examples" / script), "--mode", "strict",
               "--compiler", compiler, "--quiet", "--out", str(out), *flags, "--", *script_flags]
    began = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads((out / "report.json").read_text())["modes"]["strict"], time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--skip-175b", action="store_true", help="leave out the 512-chip case (minutes)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name, (script, flags, script_flags) in CASES.items():
            if args.skip_175b and "175B" in name:
                continue
            model, _ = run(script, flags, script_flags, "model", Path(folder) / "model")
            xla, wall = run(script, flags, script_flags, "xla", Path(folder) / "xla")
            info = xla["xla"]
            steps = max(1, len(xla["steps_s"]))
            own = xla["step_time_median_s"] + (info["estimated_s"] - info["priced_s"]) / steps
            compiles = [(p["compile_s"], p["cached"]) for p in info["per_program"]]
            rows.append((name, model["step_time_median_s"], xla["step_time_median_s"], own, compiles, wall,
                         info["fell_back"]))
    print(f"{'case':44s} {'model':>10s} {'XLA, tpusim':>12s} {'XLA, own':>10s}  compiles (s, first run)")
    for name, model_s, xla_s, own_s, compiles, wall, fell_back in rows:
        first = ", ".join(f"{s:.1f}{' cached' if cached else ''}" for s, cached in compiles)
        print(f"{name:44s} {model_s * 1e3:8.2f}ms {xla_s * 1e3:10.2f}ms {own_s * 1e3:8.2f}ms  {first}; "
              f"run {wall:.0f} s" + (f"; fell back: {len(fell_back)}" if fell_back else ""))


if __name__ == "__main__":
    main()
