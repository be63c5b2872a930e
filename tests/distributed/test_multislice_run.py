"""`tpusim run --slices N`: a script's world spread over N slices joined by DCN, a DeviceMesh dim over the slices
running its collectives on DCN, and the report's DCN section. The truth is the host NICs of
topologies/dcn.toml: a two-slice all-reduce sends each chip's buffer once across DCN (half in the
reduce-scatter, half in the all-gather), at the host's NIC bandwidth shared by the chips of the host in the
slice."""

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).parent / "scripts" / "multislice_dp.py"


def tpusim(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tpusim", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


@pytest.fixture(scope="module")
def two_slices(tmp_path_factory):
    out = tmp_path_factory.mktemp("ms") / "report"
    done = tpusim("run", str(SCRIPT), "--chip", "v6e", "--topology", "2d:2x2", "--slices", "2", "--numerics", "off",
                  "--ranks", "one", "--compiler", "model", "--quiet", "--out", str(out), "--", "2", "256")
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / "report.json").read_text()), done.stdout


def test_the_world_spans_every_chip_of_every_slice(two_slices):
    report, stdout = two_slices
    assert report["slice"]["slices"] == 2 and report["slice"]["chips_per_slice"] == 4
    assert report["run"]["world_size"] == 8
    assert "2d:2x2 x 2 slices" in stdout


def test_the_mesh_dim_over_the_slices_runs_on_dcn(two_slices):
    report, _ = two_slices
    groups = report["modes"]["strict"]["collective_groups"]
    assert {tuple(g["axes"]) for g in groups} == {("dcn",), ("x", "y")}


def test_dcn_time_is_the_buffer_over_the_hosts_nics(two_slices):
    report, stdout = two_slices
    dcn = report["modes"]["strict"]["dcn"]
    nics = tomllib.loads((ROOT / "topologies" / "dcn.toml").read_text())["v6e"]
    chips_of_host_in_slice = 4                                 # a 2x2 slice sits in one 8-chip v6e host
    per_chip = nics["nics_per_host"] * nics["nic_gbps"] * 1e9 / 8 / chips_of_host_in_slice
    buffer = 256 * 2**20
    assert dcn["collectives"] == 3 and dcn["bytes"] == pytest.approx(3 * buffer)
    assert dcn["time_s"] / 3 == pytest.approx(buffer / per_chip, rel=0.05)
    assert dcn["step_exposed_s"] == pytest.approx(dcn["time_s"] / 3, rel=0.05)   # nothing hides it
    head = report["modes"]["strict"]["headline"]
    assert head["bound"] == "DCN"
    assert "DCN collectives" in stdout and "DCN time (exposed)" in stdout


def test_one_slice_has_no_dcn_section(tmp_path):
    out = tmp_path / "one"
    done = tpusim("run", str(SCRIPT), "--chip", "v6e", "--topology", "2d:2x4", "--numerics", "off", "--ranks", "one",
                  "--compiler", "model", "--quiet", "--out", str(out), "--", "1", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    mode = json.loads((out / "report.json").read_text())["modes"]["strict"]
    assert "dcn" not in mode and mode["headline"]["bound"] != "DCN"


@pytest.mark.parametrize("value", ["0", "two", "1025"])
def test_a_bad_slice_count_is_one_line(value):
    done = tpusim("run", str(SCRIPT), "--slices", value)
    assert done.returncode == 2 and "--slices" in done.stderr and "Traceback" not in done.stderr
