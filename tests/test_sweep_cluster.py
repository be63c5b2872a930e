"""The same sweep against a separately started ``dask scheduler`` and two ``dask worker`` processes, as a user
scaling out would run them, reached through DASK_SCHEDULER_ADDRESS by the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from factories import training_trace

from tpusim.eager.modes import get_mode
from tpusim.pricing import price
from tpusim.slice.topology import build_slice
from tpusim.sweep import load_recording
from tpusim.trace.records import write_trace

DASK = [sys.executable, "-m", "dask"]


@pytest.fixture
def dask_cluster(tmp_path: Path) -> Iterator[str]:
    """A scheduler and two single-threaded worker processes; yields the scheduler's address."""
    file = tmp_path / "scheduler.json"
    started = [subprocess.Popen([*DASK, "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                                 "--scheduler-file", str(file)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        deadline = time.monotonic() + 120
        while not file.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        started += [subprocess.Popen([*DASK, "worker", "--scheduler-file", str(file), "--nworkers", "1",
                                      "--nthreads", "1", "--no-dashboard", "--name", f"w{i}"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(2)]
        address = json.loads(file.read_text())["address"]
        from distributed import Client
        with Client(address, timeout="60s") as client:
            client.wait_for_workers(2, timeout=120)
        yield address
    finally:
        for process in reversed(started):       # only the processes this fixture started
            process.terminate()
        for process in started:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


@pytest.mark.slow   # three dask processes and a sweep process start: ~1-2 min on 2 busy cores
def test_sweep_on_a_separately_started_scheduler_and_two_workers(dask_cluster: str, tmp_path: Path) -> None:
    write_trace(training_trace(steps=3), tmp_path / "program.jsonl")
    done = subprocess.run([sys.executable, "-m", "tpusim", "sweep", str(tmp_path), "--chip", "v5p,v5e",
                           "--topology", "2d:2x2,2d:4x4", "--mode", "strict,fused", "--quiet", "--out",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "DASK_SCHEDULER_ADDRESS": dask_cluster})
    assert done.returncode == 0, done.stderr
    table = pd.read_parquet(tmp_path / "out" / "sweep.parquet")
    assert len(table) == 8 and (table.status == "ok").all()
    trace = load_recording(tmp_path).trace
    for row in table.itertuples():
        alone = price(trace, topology=build_slice(row.topology, chip=row.chip), mode=get_mode(row.mode))
        assert row.total_s == pytest.approx(alone.total_s, rel=1e-12)
    assert set(table.worker) == {"w0", "w1"}              # both separately started workers priced points
    bad = subprocess.run([sys.executable, "-m", "tpusim", "sweep", str(tmp_path), "--chip", "v5p", "--topology",
                          "2d:2x2", "--scheduler", "tcp://127.0.0.1:1"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "cannot reach the Dask scheduler at 'tcp://127.0.0.1:1'" in bad.stderr
