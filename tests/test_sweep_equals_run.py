"""`tpusim sweep` prices a point exactly as `tpusim run` prices it (issue 41 item 3): a script run once with
`tpusim run` (every mode, one --compiler), then its folder swept over the run's own chip, topology and modes
with the same --compiler; each row's step time is report.json's for that mode. The independent truth is `tpusim
run`'s own report, written by its pipeline; the sweep prices the saved recording on Dask workers. With the xla
extra, the compiler path too: before the fix a sweep never passed the compiler's kernels to pricing, so its
Strict step (eager ops run as XLA's one-op programs) and its compiled graph came out as tpusim's model."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tpusim.sweep import sweep
from tpusim.xla.compiler import missing

SCRIPT = textwrap.dedent('''\
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.GELU(), torch.nn.Linear(256, 128)).to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    norm = torch.compile(lambda x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    for _ in range(3):
        loss = model(norm(torch.randn(16, 128, device="tpu"))).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        torch.tpu.synchronize()
''')
MODES = ("debug", "strict", "fused")


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None,
                      silence_logs=50) as cluster, Client(cluster) as dask:
        yield dask


def run_steps(tmp_path: Path, compiler: str) -> tuple[Path, dict[str, tuple]]:
    """`tpusim run` of the script in every mode with ``compiler``: its folder and report.json's (step time, total
    time, kernels) per mode."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / f"run-{compiler}"
    done = subprocess.run([sys.executable, "-m", "tpusim", "run", str(script), "--chip", "v6e", "--topology",
                           "2d:1x1", "--mode", "all", "--numerics", "off", "--compiler", compiler, "--out", str(out),
                           "--quiet"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    modes = report["modes"]
    return out, {m: (modes[m]["step_time_median_s"], modes[m]["total_s"], modes[m]["kernels"]) for m in MODES}


def swept_steps(folder: Path, compiler: str, client) -> dict[str, tuple]:
    """The sweep of ``folder`` over the run's own chip and topology, every mode: (step, total, kernels) per mode."""
    table = sweep(folder, modes=(",".join(MODES),), client=client, compiler=compiler)
    assert set(table.status) == {"ok"}, table.error.tolist()
    return {row.mode: (row.step_time_s, row.total_s, row.kernels) for row in table.itertuples()}


def same(swept: dict[str, tuple], reported: dict[str, tuple]) -> bool:
    """Equal per mode up to report.json's rounding (9 significant digits)."""
    return swept.keys() == reported.keys() and all(swept[m] == pytest.approx(reported[m], rel=1e-8) for m in swept)


@pytest.mark.slow
def test_a_sweep_point_is_priced_as_run_prices_it_with_the_model(tmp_path: Path, client) -> None:
    folder, steps = run_steps(tmp_path, "model")
    assert same(swept_steps(folder, "model", client), steps)


@pytest.mark.slow
@pytest.mark.skipif(missing() is not None, reason="the xla extra (libtpu) is not installed")
def test_a_sweep_point_is_priced_as_run_prices_it_with_the_tpu_compiler(tmp_path: Path, client) -> None:
    folder, steps = run_steps(tmp_path, "xla")
    assert same(swept_steps(folder, "xla", client), steps)
    model = swept_steps(folder, "model", client)     # XLA's kernels are what run priced: the test can fail
    assert model["strict"][1:] != pytest.approx(steps["strict"][1:], rel=1e-6)
