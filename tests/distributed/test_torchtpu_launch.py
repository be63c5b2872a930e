"""Launch as TorchTPU users do: a TorchTPU training script runs unchanged under plain torchrun and under `tpusim run`.

The script (scripts/torchtpu_ddp.py) trains with DDP on TorchTPU's "tpu_dist" backend, switches eager modes with
``torch.tpu.set_eager_mode``, compiles with ``torch.compile(model)`` (no backend) and reads
``torch.tpu._get_cache_stats()``. The independent truth is a single CPU process doing what DDP does (each rank's
gradients divided by the world and summed, then the same SGD step): losses and parameters must be equal bit for
bit; the compiled model's predictions (computed through JAX) equal CPU's within float32 rounding.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().parent / "scripts" / "torchtpu_ddp.py"
WORLD = 2

pytest.importorskip("jax")          # torch.compile(model) on tpu inputs goes through JAX (the pjrt extra)


def _script():
    spec = importlib.util.spec_from_file_location("torchtpu_ddp", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cpu_reference(world: int = WORLD) -> dict:
    """What the DDP script computes, in one CPU process: per step, each rank's loss and gradients on its slice,
    the gradients divided by the world and summed (DDP's all-reduce), one SGD step."""
    script = _script()
    net = script.model()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    xs, ys = script.data(world)
    b = script.BATCH
    losses = []
    for step in range(script.STEPS):
        step_losses, grads = [], []
        for r in range(world):
            loss = ((net(xs[step, r * b:(r + 1) * b]) - ys[step, r * b:(r + 1) * b]) ** 2).mean()
            grads.append(torch.autograd.grad(loss, list(net.parameters())))
            step_losses.append(loss.detach())
        for p, *per_rank in zip(net.parameters(), *grads):
            p.grad = sum(g / world for g in per_rank)
        opt.step()
        losses.append(sum(step_losses).item() / world)
    with torch.no_grad():
        pred = net(xs[1, :b])
    return {"losses": losses, "params": [p.detach().flatten().tolist() for p in net.parameters()],
            "pred": pred.flatten().tolist()}


def _result(stdout: str) -> dict:
    line = next((ln for ln in stdout.splitlines() if "RESULT " in ln), None)
    assert line is not None, stdout[-3000:]
    return json.loads(line.split("RESULT ", 1)[1])


def _check(result: dict, backend: str) -> None:
    ref = cpu_reference()
    assert result["backend"] == backend and result["world"] == WORLD
    assert result["modes"] == ["DEFER_NEVER", "DEFER_AND_FUSE", "DEFER_NEVER_AND_LAUNCH_BLOCKING"]
    assert result["losses"] == ref["losses"]                     # exact: every op is CPU's kernel
    assert result["params"] == ref["params"]
    torch.testing.assert_close(torch.tensor(result["pred"]), torch.tensor(ref["pred"]), atol=1e-5, rtol=1e-5)
    # two executions of the compiled forward with the same shapes: one compile, one hit, one entry
    assert result["cache"] == {"requests": 2, "hits": 1, "entries": 1}   # the compiled graph: one miss, one hit
    assert result["eager_requests"] > 0                                  # and every eager op before it


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TPUSIM_", "TORCH_TPU_", "TPU_"))}
    return {**env, "PYTHONUNBUFFERED": "1"}


@pytest.mark.parametrize("backend", ["tpu_dist", pytest.param("tpu", marks=pytest.mark.slow)])   # one backend, two
# names (device.C10D_NAMES: test_torchtpu_api checks they are one backend); the slow run trains under the second
def test_torchrun_trains_on_tpu_with_exact_numerics(backend: str) -> None:
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                             f"--nproc_per_node={WORLD}", str(SCRIPT), backend],
                            cwd=ROOT, capture_output=True, text=True, timeout=600, env=_env())
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    _check(_result(result.stdout), backend)
    # the shim registers DDP's reducer timer for the tpu device (tpusim/backend/csrc/ddp_timer.cpp)
    assert "Time stats are currently only collected" not in result.stdout + result.stderr


@pytest.mark.slow      # about 21 s: a torchrun launch and a tpusim run of it
def test_tpusim_run_prices_the_same_script(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "tpusim", "run", str(SCRIPT), "--topology", "2d:2x1", "--quiet",
                             "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=600,
                            env=_env())
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "[rank 0] RESULT" in result.stdout and "(2 ranks recorded)" in result.stdout   # only rank 0 prints
    _check(_result(result.stdout), "tpu_dist")
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["distributed"]["ranks"] == "all" and report["distributed"]["world_size"] == WORLD
    assert {c["kind"] for c in report["modes"]["strict"]["collectives"]} >= {"all_reduce"}
