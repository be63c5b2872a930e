"""The record budget under --ranks all (tpusim/backend/distributed/budget.py): each rank stops on its own budget,
the merged report is priced to the step every rank recorded and says which rank stopped where."""

from __future__ import annotations

import html
import json
import subprocess
import sys
from pathlib import Path

import torch
from torch import nn

from tpusim.backend.distributed.budget import cut_to_step
from tpusim.trace.records import HostRecord, StepMarker, Trace

ROOT = Path(__file__).resolve().parents[2]
STEPS = 8

SCRIPT = f"""import torch
import torch.distributed as dist
from torch import nn
dist.init_process_group("tpusim")
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.Linear(8, 4).to("tpu")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = (torch.randn(16, 8) + rank).to("tpu")
for _ in range({STEPS}):
    opt.zero_grad()
    model(x).square().mean().backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    for _ in range(10 * rank):         # rank 1 records more a step: it reaches the budget steps sooner
        x = x * 1.0
    opt.step()
print(f"rank {{rank}} weight", model.weight.detach().cpu().flatten().tolist())
dist.destroy_process_group()
"""


def _reference_weight() -> list[float]:
    """The two ranks' data-parallel SGD on CPU: gradients summed over the ranks, as all_reduce does."""
    torch.manual_seed(0)
    model = nn.Linear(8, 4)
    data = torch.randn(16, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(STEPS):
        grads = []
        for rank in (0, 1):
            model.zero_grad()
            model(data + rank).square().mean().backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        for p, g0, g1 in zip(model.parameters(), *grads, strict=True):
            p.grad = g0 + g1
        opt.step()
    return model.weight.detach().flatten().tolist()


def test_ranks_all_merged_report_says_which_rank_stopped_where_and_prices_the_common_steps(tmp_path: Path) -> None:
    path, out = tmp_path / "ddp.py", tmp_path / "out"
    path.write_text(SCRIPT)
    result = subprocess.run([sys.executable, "-m", "tpusim", "run", str(path), "--topology", "2d:1x2", "--ranks", "all",
                             "--quiet", "--max-records", "150", "--out", str(out)], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    stopped = json.loads((out / "report.json").read_text())["recording_stopped"]
    by_rank = {r["rank"]: r for r in stopped["ranks"]}
    assert sorted(by_rank) == [0, 1] and all(r["steps"] == STEPS for r in by_rank.values())
    assert 1 <= by_rank[1]["after_step"] < by_rank[0]["after_step"] < STEPS    # rank 1 records more a step
    assert stopped["after_step"] == by_rank[1]["after_step"] and stopped["steps"] == STEPS
    assert stopped["max_records"] == 150 and all(r["records"] >= 150 for r in by_rank.values())
    report = json.loads((out / "report.json").read_text())
    assert report["program"]["steps"] == stopped["after_step"]          # every rank cut to the common step
    assert report["modes"]["strict"]["steps"]["count"] == stopped["after_step"]
    where = (f"rank 0 after step {by_rank[0]['after_step']} of {STEPS}, rank 1 after step {by_rank[1]['after_step']} "
             f"of {STEPS}; every rank is priced to step {stopped['after_step']} of {STEPS}")
    assert stopped["note"].startswith(f"recording stopped on {where} (record budget 150 records a rank")
    assert f"note: {stopped['note']}; the figures are the recorded steps'" in result.stdout
    assert stopped["note"] in html.unescape((out / "report.html").read_text())
    want = _reference_weight()
    for rank in (0, 1):
        line = next(ln for ln in result.stdout.splitlines() if ln.startswith(f"[rank {rank}] rank {rank} weight "))
        got = json.loads(line.split(" weight ", 1)[1])
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-6, atol=1e-7)


def test_cut_to_step_keeps_whole_steps_or_what_came_before_the_first() -> None:
    records = (HostRecord(0, "sync", "item"), StepMarker(1, 1), HostRecord(2, "sync", "item"), StepMarker(3, 2),
               HostRecord(4, "sync", "item"))
    trace = Trace(records=records, world_size=2, rank=1)
    assert cut_to_step(trace, 0).records == records[:1]
    assert cut_to_step(trace, 1).records == records[:2]
    assert cut_to_step(trace, 2).records == records[:4]
    assert cut_to_step(trace, 3).records == records            # fewer steps than that: all of it
