"""`tpusim run` end to end: a bundled example, a failing script, bad input. Each run is a subprocess,
as a user would start it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MLP = ["examples/mlp.py", "--quiet"]
SMALL = ["--", "--steps", "3", "--width", "64", "--depth", "2"]


def tpusim(*argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tpusim", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


@pytest.fixture(scope="module")
def mlp_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("mlp")
    result = tpusim("run", *MLP, "--mode", "all", "--topology", "3d:2x2x2", "--out", str(out), *SMALL)
    return result, out


def test_example_runs_and_writes_every_file(mlp_run):
    result, out = mlp_run
    assert result.returncode == 0, result.stderr
    assert "step 2: loss" in result.stdout            # the script's own output is untouched
    assert "step time (median)" in result.stdout      # and the summary follows it
    for name in ("report.json", "report.html", "trace.json", "program.jsonl", "modes.png"):
        assert (out / name).is_file(), name
    report = json.loads((out / "report.json").read_text())
    assert report["complete"] and report["run"]["topology"] == "3d:2x2x2" and report["slice"]["chips"] == 8
    assert report["program"]["steps"] == 3 and len(report["modes"]["strict"]["steps_s"]) == 3
    assert report["run"]["argv"] == ["--steps", "3", "--width", "64", "--depth", "2"]


@pytest.mark.slow   # 12 s; test_report.py's test_report_json_is_deterministic checks the same bytes in-process
def test_two_runs_give_identical_report_json(mlp_run, tmp_path):
    _, out = mlp_run
    again = tpusim("run", *MLP, "--mode", "all", "--topology", "3d:2x2x2", "--out", str(tmp_path), *SMALL)
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "report.json").read_bytes() == (out / "report.json").read_bytes()


def test_a_failing_script_shows_its_own_traceback_and_a_partial_report(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text("import torch\n"
                      "x = torch.ones(4, 4, device='tpu')\n"
                      "y = (x @ x).sum()\n"
                      "def explode():\n"
                      "    raise RuntimeError('user bug on purpose')\n"
                      "explode()\n")
    result = tpusim("run", str(script), "--quiet", "--out", str(tmp_path / "out"))
    assert result.returncode == 1
    assert "RuntimeError: user bug on purpose" in result.stderr
    assert f'File "{script}", line 6' in result.stderr
    for ours in ("tpusim/run/", "tpusim/cli/", "runpy"):    # no frames of ours
        assert ours not in result.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["complete"] is False and report["error"]["type"] == "RuntimeError"
    assert report["program"]["ops"] >= 2                # the ops before the error were recorded and priced
    assert "INCOMPLETE" in result.stdout


@pytest.mark.parametrize("argv, message", [
    (["run", "no/such/script.py"], "does not exist"),
    (["run", "examples/mlp.py", "--topology", "3d:8x8"], "3d:8x8"),
    (["run", "examples/mlp.py", "--mode", "turbo"], "accepted: debug, strict"),
])
def test_bad_input_fails_before_the_script_runs(argv, message):
    result = tpusim(*argv)
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr
    assert "step 0" not in result.stdout


def test_sim_target_writes_no_measured_section(mlp_run):
    _, out = mlp_run
    report = json.loads((out / "report.json").read_text())
    assert report["run"]["target"] == "sim" and "measured" not in report


@pytest.mark.parametrize("kind, chip", [
    ("TPU v4", "v4"), ("TPU v5 lite", "v5e"), ("TPU v5e", "v5e"), ("TPU v5", "v5p"), ("TPU v5p", "v5p"),
    ("TPU v6 lite", "v6e"), ("tpu  V6E", "v6e"), ("TPU7x", "v7"),
    ("TPU v3", None), ("TPU v4 lite", None), ("cpu", None), ("NVIDIA H100 80GB HBM3", None),
])
def test_jax_device_kind_maps_to_the_tpusim_chip(kind, chip):
    from tpusim.hardware.spec import chip_for_device_kind

    found = chip_for_device_kind(kind)      # from the chip files' jax_device_kinds
    assert (found.name if found else None) == chip


@pytest.mark.parametrize("jax_installed, extra, message", [
    (False, [], 'pip install "jax[cpu]==0.10.2"'),
    (True, ["--numerics", "off"], "--target pjrt needs --numerics on"),
])
def test_target_pjrt_fails_early_with_one_line(monkeypatch, capsys, jax_installed, extra, message):
    import tpusim.run.measure
    from tpusim.cli.main import main

    monkeypatch.setattr(tpusim.run.measure, "_jax_installed", lambda: jax_installed)
    monkeypatch.setattr(tpusim.run.measure, "probe_device", lambda *a: pytest.fail("JAX was asked for its device"))
    code = main(["run", "examples/mlp.py", "--target", "pjrt", *extra])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert message in captured.err and len(captured.err.strip().splitlines()) == 1 and "Traceback" not in captured.err
