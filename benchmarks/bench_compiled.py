"""A GPT-3-175B-shaped training step, compiled per block, recorded and priced in every eager mode: wall time.

    python benchmarks/bench_compiled.py [--layers 96] [--topology 3d:8x8x8]

Runs ``tpusim run examples/gpt3.py --preset 175b`` (96 blocks, each ``torch.compile``'d; FSDP2 x TP x
sequence parallel; int8 matmuls) with ``--numerics off --ranks one --mode all`` as a user would, and prints
the wall time of the whole run and of its phases (recording, pricing each mode) as tpusim reports them,
against the target of 60 s on a 2-core machine, then what the report says of the compiled program:
graphs that ran op by op, collectives exposed vs hidden, int8 matmuls bound by HBM.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 60.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=96)
    parser.add_argument("--topology", default="3d:8x8x8")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "-m", "tpusim", "run", str(ROOT / "examples" / "gpt3.py"), "--topology",
                   args.topology, "--ranks", "one", "--numerics", "off", "--mode", "all", "--out", out, "--",
                   "--preset", "175b", "--layers", str(args.layers), "--steps", "1", "--batch", "1", "--int8"]
        started = time.perf_counter()
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - started
        if result.returncode != 0:
            sys.exit(f"tpusim run failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
        report = json.loads((Path(out) / "report.json").read_text())
        with open(Path(out) / "program.jsonl") as trace:
            compiled = json.loads(trace.readline())["meta"].get("torch_compile") or {}
    log = result.stdout + result.stderr
    print(f"GPT-3 175B shape, {args.layers} blocks compiled, {args.topology}, numerics off, all modes")
    for line in re.findall(r"tpusim: (recorded .*|priced .*)", log):
        print(f"  {line}")
    print(f"wall {wall:.1f} s, target {TARGET_S:.0f} s: ratio {wall / TARGET_S:.2f}")
    print(f"compiled graphs {compiled.get('graphs', '?')}, ran op by op: {len(compiled.get('eager_graphs', []))}")
    for name, mode in report["modes"].items():
        int8 = sorted({op["bound"] for op in mode.get("top_ops", []) if op.get("dtype") == "int8"})
        print(f"  {name:8s} step {mode['total_s'] * 1e3:9.1f} ms  collectives exposed "
              f"{mode['device_s']['collective_exposed'] * 1e3:8.2f} ms  hidden "
              f"{mode['collective_overlapped_s'] * 1e3:8.2f} ms  int8 matmuls bound by {', '.join(int8) or '-'}")


if __name__ == "__main__":
    main()
