"""The TPU compiler's cost across runs and cores (the xla extra; skipped without it; issue 41 item 4).

A small training loop (a torch.compile'd block and eager ops) is run once with ``tpusim run --compiler xla
--mode all`` and a compile cache of its own. Then, from its recording:

- a second run's compiles (``estimate_programs``, as ``tpusim run`` asks them) find every program in that cache:
  no worker process starts, and what XLA built is the first run's;
- compiled again from an empty cache one program at a time (one worker) and three at a time (three workers),
  the modes price exactly the same.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tpusim.eager.modes import get_mode
from tpusim.hardware.spec import load_chip
from tpusim.pricing import price
from tpusim.pricing.compiled import compiler_output
from tpusim.slice.topology import build_slice
from tpusim.trace.records import read_trace
from tpusim.xla import compiler
from tpusim.xla.compiler import missing
from tpusim.xla.programs import estimate_programs

# slow: one cold `tpusim run` and two compiles of its programs, ~45 s on 2 busy cores
pytestmark = [pytest.mark.xla, pytest.mark.slow, pytest.mark.skipif(missing() is not None, reason=str(missing()))]
ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import torch
model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.GELU(), torch.nn.Linear(256, 128)).to("tpu")
head = torch.compile(torch.nn.Linear(128, 128).to("tpu"))
opt = torch.optim.SGD([*model.parameters(), *head.parameters()], lr=0.1)
for _ in range(2):
    head(model(torch.randn(32, 128, device="tpu"))).sum().backward()
    opt.step()
    opt.zero_grad()
"""
MODES = ("debug", "strict", "fused")


@pytest.fixture(scope="module")
def first_run(tmp_path_factory) -> tuple[Path, Path, str]:
    """The recording and the cache of one cold ``tpusim run --compiler xla`` (two workers), and its stderr."""
    folder = tmp_path_factory.mktemp("compile_runs")
    script, out, cache = folder / "train.py", folder / "out", folder / "cache"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, "-m", "tpusim", "run", str(script), "--chip", "v5e", "--mode", "all",
                           "--numerics", "off", "--compiler", "xla", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=900,
                          env={**os.environ, "XDG_CACHE_HOME": str(cache)})
    assert done.returncode == 0, done.stderr[-3000:]
    return out / "program.jsonl", cache, done.stderr


def priced(trace, xla) -> dict[str, float]:
    slice_ = build_slice("2d:1x1", chip="v5e")
    return {name: price(trace, topology=slice_, mode=get_mode(name), compiled=compiler_output(xla)).total_s
            for name in MODES}


def test_a_second_run_finds_every_program_in_the_cache(first_run, monkeypatch):
    recording, cache, stderr = first_run
    assert "XLA: compiling" in stderr and "XLA: compiled" in stderr     # the first run compiled, and said so
    entries = {p.name: p.stat().st_mtime_ns for p in (cache / "tpusim" / "xla").iterdir()}
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))

    def no_compile(self, text, target, timeout_s):
        raise AssertionError(f"compiled again: {text[:200]}")

    monkeypatch.setattr(compiler._Worker, "compile", no_compile)
    heard: list[str] = []
    trace = read_trace(recording)
    xla = estimate_programs(trace, load_chip("v5e"), heard.append)
    assert heard == []                                              # nothing to compile, nothing said
    assert xla.compiled and all(p.cached for p in xla.compiled) and not xla.fell_back
    assert xla.ops and xla.clusters                                 # eager ops and Fused clusters from the cache too
    assert len(xla.ops) == len([m for m in trace.meta.xla_ops if m.stablehlo])
    assert {p.name: p.stat().st_mtime_ns for p in (cache / "tpusim" / "xla").iterdir()} == entries


def test_one_worker_and_three_workers_price_the_same(first_run, tmp_path, monkeypatch):
    recording, _, _ = first_run
    trace, chip = read_trace(recording), load_chip("v5e")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "serial"))
    serial = estimate_programs(trace, chip, workers=1)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "parallel"))
    parallel = estimate_programs(trace, chip, workers=3)
    assert not any(p.cached for p in (*serial.compiled, *parallel.compiled))
    assert priced(trace, serial) == priced(trace, parallel)
    assert serial.op_kernels() == parallel.op_kernels() and serial.cluster_kernels() == parallel.cluster_kernels()
