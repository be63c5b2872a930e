"""Functional collectives inside torch.compile(backend="tpu") graphs (tpusim/backend/torch_compile/collective_graph.py).

The schedule test builds an FX graph by hand (fast); the runs start `tpusim run` as a user does
(slow: every rank compiles its graph)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.fx

from tpusim.backend.torch_compile.collective_graph import SegmentedGraph, schedule_for_overlap

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().parent / "scripts" / "compiled_funcol.py"
aten, c10d = torch.ops.aten, torch.ops._c10d_functional


def _graph() -> torch.fx.GraphModule:
    """x, w -> relu(x @ w) + sum(all_gather(x)), the collective written after the matmul it could overlap."""
    g = torch.fx.Graph()
    x, w = g.placeholder("x"), g.placeholder("w")
    mm = g.call_function(aten.mm.default, (x, w))
    relu = g.call_function(aten.relu.default, (mm,))
    gather = g.call_function(c10d.all_gather_into_tensor.default, (x, 2, "0"))
    waited = g.call_function(c10d.wait_tensor.default, (gather,))
    total = g.call_function(aten.sum.default, (waited,))
    g.output((g.call_function(aten.add.Tensor, (relu, total)),))
    return torch.fx.GraphModule(torch.nn.Module(), g)


def _order(gm: torch.fx.GraphModule) -> list[str]:
    return [str(n.target).split(".")[-2] if n.op == "call_function" else n.op for n in gm.graph.nodes]


def test_collectives_start_after_their_inputs_and_are_waited_on_by_their_first_reader():
    gm = _graph()
    schedule_for_overlap(gm)
    assert _order(gm) == ["placeholder", "placeholder", "all_gather_into_tensor", "mm", "relu", "wait_tensor",
                          "sum", "add", "output"]


def test_the_graph_splits_into_compiled_segments_around_the_collectives():
    compiled = []
    graph = SegmentedGraph(_graph(), lambda sub, fakes, part: compiled.append(sub) or sub)
    assert graph.collectives == 1 and graph.compiled_segments == 2
    ops = [[str(n.target).split(".")[-2] for n in sub.graph.nodes if n.op == "call_function"] for sub in compiled]
    assert ops == [["mm", "relu"], ["sum", "add"]]     # the wait runs between them, the gather before


def tpusim(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tpusim", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=900, env=dict(os.environ))


@pytest.mark.slow
def test_ranks_all_compiled_collectives_match_cpu_and_run_async(tmp_path):
    result = tpusim("run", str(SCRIPT), "--topology", "2d:2x2", "--ranks", "all", "--quiet", "--out", str(tmp_path))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for rank in range(4):
        for name in ("all_reduce", "all_gather", "reduce_scatter"):
            assert f"[rank {rank}] OK {name}" in result.stdout
    graphs = json.loads(result.stdout.split("[rank 0] GRAPHS ", 1)[1].splitlines()[0])
    (graph,) = graphs
    # no graph ran op by op: compiled runs split only at the collectives (at most one more run than them)
    assert graph["lowered"] and graph["collectives"] == 3 and 1 < graph["segments"] <= 4
    strict = json.loads((tmp_path / "report.json").read_text())["modes"]["strict"]
    kinds = {(c["kind"], c["async"]) for c in strict["collectives"]}
    assert kinds == {("all_gather", True), ("all_reduce", True), ("reduce_scatter", True)}


@pytest.mark.slow
def test_a_collective_independent_of_large_matmuls_is_hidden_behind_them(tmp_path):
    result = tpusim("run", str(SCRIPT), "--topology", "2d:4x4", "--ranks", "one", "--numerics", "off",
                    "--quiet", "--out", str(tmp_path), "--", "--size", "4096", "--gather-only")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    strict = json.loads((tmp_path / "report.json").read_text())["modes"]["strict"]
    gathers = [c for c in strict["collectives"] if c["kind"] == "all_gather" and c["async"]]
    assert len({c["seq"] for c in gathers}) == 2          # one per call
    # the second call compiles nothing: only the matmuls it was moved ahead of can hide it, and do
    assert strict["device_s"]["collective_exposed"] < 0.05 * gathers[1]["time_s"]
    assert strict["collective_overlapped_s"] == pytest.approx(2 * gathers[1]["time_s"], rel=0.05)


@pytest.mark.slow
@pytest.mark.parametrize("flags", [[], ["--int8", "--checkpoint"]], ids=["float", "int8-checkpoint"])
def test_gpt3_example_compiled_per_block_trains_like_cpu(tmp_path, flags):
    """FSDP2 x TP + sequence parallel, every block compiled: parameters after training equal CPU's (int8:
    the CPU model quantises row-parallel rows per tensor-parallel shard, as the ranks do)."""
    result = tpusim("run", str(ROOT / "examples" / "gpt3.py"), "--topology", "2d:2x2", "--ranks", "all", "--quiet",
                    "--out", str(tmp_path), "--", "--check", *flags)     # a 2 x 2 mesh: fsdp=2 x tp=2
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # the CPU reference's own optimizer steps are not the program's steps
    assert json.loads((tmp_path / "report.json").read_text())["modes"]["strict"]["steps"]["count"] == 2
    for rank in range(4):
        assert f"[rank {rank}] OK parameters equal the CPU run" in result.stdout
    meta = json.loads((tmp_path / "program.jsonl").read_text().splitlines()[0])["meta"]["torch_compile"]
    assert meta["graphs"] >= 2 and meta["eager_graphs"] == []          # forward and backward, none op by op
    strict = json.loads((tmp_path / "report.json").read_text())["modes"]["strict"]
    assert {c["kind"] for c in strict["collectives"] if c["async"]} >= {"all_gather", "reduce_scatter"}
