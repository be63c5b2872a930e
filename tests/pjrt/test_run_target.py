"""`tpusim run --target pjrt` end to end: the prediction, then each mode run for real through JAX in its own
process, and the report's `measured` section that sets the two side by side. Each run is a subprocess, as a
user would start it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from statistics import median

import pytest

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--", "--steps", "3", "--width", "64", "--depth", "2"]
NOT_TPU = "absolute times are not comparable with the TPU prediction; compare the ratios between modes"


def tpusim(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tpusim", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


@pytest.fixture(scope="module")
def measured_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, dict, Path]:
    out = tmp_path_factory.mktemp("mlp-pjrt")
    result = tpusim("run", "examples/mlp.py", "--quiet", "--target", "pjrt", "--mode", "strict,fused",
                    "--out", str(out), *SMALL)
    assert result.returncode == 0, result.stderr
    return result, json.loads((out / "report.json").read_text()), out


def test_each_mode_ran_for_real_with_the_steps_of_the_script(measured_run) -> None:
    result, report, _ = measured_run
    assert result.stdout.count("step 2: loss") == 3          # recorded once, then run once per mode
    assert report["run"]["target"] == "pjrt"
    measured = report["measured"]
    assert set(measured["modes"]) == {"strict", "fused"} and measured["baseline"] == "strict"
    for mode, entry in measured["modes"].items():
        assert entry["exit_code"] == 0 and entry["error"] is None
        assert entry["target_mode"] == mode                  # the PJRT target really ran in that mode
        assert entry["steps"] == len(entry["steps_s"]) == report["program"]["steps"] == 3
        assert all(s > 0 for s in entry["steps_s"])
        assert entry["first_step_s"] == entry["steps_s"][0]
        assert entry["step_time_median_s"] == pytest.approx(median(entry["steps_s"][1:]), rel=1e-6)
        assert sum(entry["steps_s"]) <= entry["total_s"] * (1 + 1e-6)


def test_ratios_follow_the_medians_measured_and_simulated(measured_run) -> None:
    _, report, _ = measured_run
    modes, simulated = report["measured"]["modes"], report["modes"]
    strict = modes["strict"]
    assert strict["ratio"] == {"measured": 1.0, "simulated": 1.0}
    for mode, entry in modes.items():
        assert entry["simulated_step_time_median_s"] == simulated[mode]["step_time_median_s"]
        assert entry["ratio"]["measured"] == pytest.approx(
            entry["step_time_median_s"] / strict["step_time_median_s"], rel=1e-6)
        assert entry["ratio"]["simulated"] == pytest.approx(
            simulated[mode]["step_time_median_s"] / simulated["strict"]["step_time_median_s"], rel=1e-6)


def test_the_chip_and_the_note_follow_the_jax_device(measured_run) -> None:
    result, report, out = measured_run
    measured = report["measured"]
    assert measured["platform"] and measured["device_kind"] and measured["jax_version"]
    assert measured["chip"] == report["run"]["chip"] == report["chip"]["name"]
    if measured["is_tpu"]:
        assert measured["chip_from"] in ("device", "default")
    else:                                                     # no TPU: the default chip, and the ratios note
        assert measured["chip"] == "v5p" and measured["chip_from"] == "default"
        note = f"JAX device is {measured['platform']}: {NOT_TPU}"
        assert note in measured["notes"] and f"note: {note}" in result.stdout
    assert "vs strict, measured" in result.stdout and "vs strict, simulated" in result.stdout
    page = (out / "report.html").read_text()
    assert "Measured on the PJRT target" in page and "vs strict, simulated" in page


def test_a_script_that_fails_only_for_real_is_reported_with_its_own_traceback(tmp_path: Path) -> None:
    script = tmp_path / "real_only.py"
    script.write_text("import os\n"
                      "import torch\n"
                      "import tpusim.backend\n"
                      "x = torch.ones(4, 4, device='tpu')\n"
                      "y = (x @ x).sum()\n"
                      "tpusim.backend.step()\n"
                      "if os.environ.get('TPUSIM_TARGET') == 'pjrt':\n"
                      "    raise RuntimeError('only on the real device')\n")
    result = tpusim("run", str(script), "--quiet", "--target", "pjrt", "--out", str(tmp_path / "out"))
    assert result.returncode == 1                            # the measured run's exit status
    assert "RuntimeError: only on the real device" in result.stderr
    assert f'File "{script}", line 8' in result.stderr
    assert "measure_worker" not in result.stderr and "runpy" not in result.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["complete"] is True                        # the recording itself finished
    strict = report["measured"]["modes"]["strict"]
    assert strict["exit_code"] == 1 and strict["error"]["type"] == "RuntimeError"
    assert strict["steps"] == report["program"]["steps"] == 1   # an explicit tpusim.backend.step() counts
    assert "only on the real device" in strict["error"]["traceback"]
    assert "measured strict: the run failed with RuntimeError" in result.stdout
