"""A torch.compile graph with a collective through the real TPU compiler, compiled whole over its group
(the xla extra; skipped without it): XLA's schedule, with its overlap, prices the step.

The script gathers a weight that nothing needs until the end, then runs four matmuls. On v5e, with the
flags published runs pass libtpu (topologies/chips/v5e.toml), XLA starts the all-gather before the matmuls
and finishes it after them; tpusim then prices it running under them, on its ICI model.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tpusim.hardware.spec import load_chip
from tpusim.trace.records import read_trace
from tpusim.xla.compiler import compile_stablehlo, missing, target_for
from tpusim.xla.hlo import parse_program

pytestmark = [pytest.mark.xla, pytest.mark.skipif(missing() is not None, reason=str(missing()))]
ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import tpusim.backend

dist.init_process_group("tpusim")
group = dist.new_group(list(range(dist.get_world_size())))

@torch.compile(backend="tpu")
def step(w, x):
    gathered = funcol.all_gather_tensor(w, 0, group)
    y = x
    for _ in range(4):
        y = torch.tanh(y @ x)
    return gathered.sum() + y.sum()

w = torch.randn(4096, 4096, device="tpu", dtype=torch.bfloat16)
x = torch.randn(4096, 4096, device="tpu", dtype=torch.bfloat16)
for _ in range(2):
    step(w, x)
    tpusim.backend.step()
"""


def run(tmp_path: Path, compiler: str) -> dict:
    script = tmp_path / "overlap.py"
    script.write_text(SCRIPT)
    out = tmp_path / compiler
    done = subprocess.run([sys.executable, "-m", "tpusim", "run", str(script), "--topology", "2d:2x4", "--chip", "v5e",
                           "--numerics", "off", "--mode", "strict", "--compiler", compiler, "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / "report.json").read_text())["modes"]["strict"]


@pytest.mark.slow      # about 50 s: XLA compiles a whole graph with collectives
def test_an_all_gather_xla_overlaps_with_matmuls_is_priced_under_them(tmp_path):
    mode = run(tmp_path, "xla")
    (row,) = mode["xla"]["per_program"]
    assert row["devices"] == 8 and row["label"] == "graph 0 (inference)" and mode["xla"]["fell_back"] == []
    # what XLA built: the all-gather's start before the matmuls, its done after them
    (module,) = [m for m in read_trace(tmp_path / "xla" / "program.jsonl").meta.xla_modules if m.devices == 8]
    schedule = parse_program(compile_stablehlo(module.stablehlo, target_for(load_chip("v5e"), 8)).hlo).schedule
    whats = [s.what for s in schedule]
    assert whats[0] == "start" and whats[1:whats.index("done")].count("kernel") >= 4
    # priced so: the step is the longer of the matmuls and the all-gather, not their sum
    kernels_s = row["priced_s"] / row["executions"]
    gather_s = mode["device_s"]["collective_exposed"] + mode["collective_overlapped_s"]
    assert mode["collective_overlapped_s"] > 0
    assert mode["step_time_median_s"] < kernels_s + gather_s / row["executions"]
