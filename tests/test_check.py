"""`tpusim check`, the CI gate: budgets and lint codes against report.json (tpusim/testing/budgets.py), its
JUnit XML, and the exit codes and lines a CI user sees on a sample project (one passing, one over budget,
one lint failure, one failing script, bad input)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from factories import TRAINING_SCRIPT

from tpusim.errors import TpusimError
from tpusim.report.lint import RULES
from tpusim.report.schema import Report
from tpusim.testing.budgets import (
    Budgets,
    HbmLimit,
    evaluate,
    lint_code,
    parse_hbm,
    parse_lint_list,
    parse_seconds,
    script_check,
)
from tpusim.testing.junit import junit_xml

GIB = 2**30
MODE = {"total_s": 0.1, "kernels": 10, "host_s": {"dispatch": 0.0, "stall": 0.0},   # unread here
        "device_s": {"collective_exposed": 0.0}}
REPORT_JSON = {
    "schema": "tpusim-report", "version": 3, "complete": True, "error": None, "exit_code": 0,
    "run": {"script": "train.py", "topology": "3d:4x4x4", "chip": "v5p", "argv": [], "numerics": "on",
            "torch_version": "", "modes": ["strict", "fused"]},
    "chip": {"hbm_bytes": 95 * GIB, "name": "v5p", "display_name": "TPU v5p", "peak_bf16_flops_per_s": 4.59e14,
             "hbm_bytes_per_s": 2.765e12},
    "slice": {"chips": 64, "dims": [4, 4, 4]},
    "program": {"ops": 10, "collectives": 0, "syncs": 0, "steps": 3, "model_flops": 0.0},
    "modes": {"strict": {**MODE, "step_time_median_s": 0.020, "hfu": 0.4,
                         "hbm": {"peak_bytes": 60 * GIB, "capacity_bytes": 95 * GIB, "peak_fraction": 60 / 95}},
              "fused": {**MODE, "step_time_median_s": 0.012, "hfu": 0.6,
                        "hbm": {"peak_bytes": 50 * GIB, "capacity_bytes": 95 * GIB, "peak_fraction": 50 / 95}}},
    "warnings": [{"code": "host-sync", "message": "host sync `item` inside the step loop", "source": "train.py:9"}],
}
REPORT = Report.model_validate(REPORT_JSON)


def test_budget_parsers_accept_what_the_readme_says_and_name_what_is_wrong() -> None:
    assert parse_seconds("12ms") == pytest.approx(0.012) and parse_seconds("0.5s") == 0.5
    assert parse_seconds("250us") == pytest.approx(250e-6) and parse_seconds("2") == 2.0
    assert parse_hbm("0.9") == HbmLimit(fraction=0.9) and parse_hbm("90%") == HbmLimit(fraction=0.9)
    assert parse_hbm("12GiB") == HbmLimit(bytes=12 * GIB)
    assert parse_lint_list("f64,host-sync,F64") == ("float64", "host-sync")
    assert parse_lint_list("all") == tuple(RULES)
    assert all(lint_code(code) == code for code in RULES)          # every report code is accepted as is
    for bad, words in (("fast", "give a duration"), ("-1ms", "must be a positive duration"), ("0s", "positive")):
        with pytest.raises(TpusimError, match=words):
            parse_seconds(bad)
    for bad in ("2", "150%", "0", "lots"):
        with pytest.raises(TpusimError, match="--max-hbm"):
            parse_hbm(bad)
    with pytest.raises(TpusimError, match="unknown lint code 'f32'.*float64, host-sync"):
        parse_lint_list("f32")


def test_each_budget_passes_at_its_limit_and_fails_just_past_it() -> None:
    at_limit = evaluate(REPORT, Budgets(max_step_time_s=0.020, max_hbm=HbmLimit(bytes=60 * GIB)))
    assert [c.name for c in at_limit] == ["step-time[strict]", "hbm[strict]", "step-time[fused]", "hbm[fused]"]
    assert all(c.passed for c in at_limit)
    past = {c.name: c for c in evaluate(REPORT, Budgets(max_step_time_s=0.015, max_hbm=HbmLimit(fraction=0.6)))}
    assert not past["step-time[strict]"].passed and past["step-time[fused]"].passed      # 20 ms > 15 ms > 12 ms
    assert not past["hbm[strict]"].passed and past["hbm[fused]"].passed                  # 60/95 > 0.6 > 50/95
    assert past["step-time[strict]"].message == ("step time 20 ms > budget 15 ms (strict mode on 3d:4x4x4 v5p)")
    assert past["hbm[strict]"].message == "HBM peak 60 GiB = 63.2% of 95 GiB > budget 60% of HBM"


def test_lint_codes_fail_only_when_found() -> None:
    checks = {c.name: c for c in evaluate(REPORT, Budgets(fail_on=("float64", "host-sync")))}
    assert checks["lint[float64]"].passed
    assert not checks["lint[host-sync]"].passed
    assert checks["lint[host-sync]"].message == ("1 host-sync finding(s): train.py:9: host sync `item` inside the "
                                                 "step loop")


def test_a_script_that_did_not_finish_is_its_own_failure() -> None:
    assert script_check(REPORT).passed
    failed = copy.deepcopy(REPORT_JSON)
    failed.update(complete=False, exit_code=1, error={"type": "ValueError", "traceback": "Traceback...\nValueError: x"})
    check = script_check(Report.model_validate(failed))
    assert not check.passed and check.message == "train.py: the script raised ValueError (ValueError: x)"


def test_junit_xml_has_one_testcase_per_check_and_a_failure_for_each_failed() -> None:
    checks = evaluate(REPORT, Budgets(max_step_time_s=0.015, fail_on=("host-sync",)))
    root = ET.fromstring(junit_xml("tpusim check train.py", checks, 1.5))
    suite = root.find("testsuite")
    assert suite.get("tests") == "3" and suite.get("failures") == "2" and suite.get("time") == "1.500"
    cases = {case.get("name"): case for case in suite.iter("testcase")}
    assert set(cases) == {"step-time[strict]", "step-time[fused]", "lint[host-sync]"}
    assert cases["step-time[fused]"].find("failure") is None
    assert cases["lint[host-sync]"].find("failure").get("type") == "lint"
    assert cases["step-time[strict]"].find("failure").get("message").startswith("step time 20 ms > budget 15 ms")


def _check(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tpusim", "check", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600)


def test_bad_input_is_exit_code_2_with_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture) -> None:
    from tpusim.cli.main import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('never runs')\n")
    for args, words in ((["train.py", "--fail-on", "f32"], "unknown lint code 'f32'"),
                        (["train.py", "--max-step-time", "soon"], "--max-step-time 'soon': give a duration"),
                        (["missing.py"], "script 'missing.py' does not exist"),
                        (["train.py", "--junit", "nowhere/x.xml"], "--junit 'nowhere/x.xml': its folder")):
        try:
            code = main(["check", *args])
        except SystemExit as exit_:             # argparse's own usage error
            code = exit_.code
        out, err = capsys.readouterr()
        assert code == 2, (args, err)
        assert words in err and "Traceback" not in err and "never runs" not in out


SYNC_IN_LOOP = TRAINING_SCRIPT.replace("    opt.step()", "    print(w.sum().item())\n    opt.step()")
CRASH = "import torch\nx = torch.ones(3, device='tpu')\nraise ValueError('bad batch')\n"


@pytest.mark.slow      # four `tpusim check` runs, each importing torch: ~1 min on 2 busy cores
def test_the_exit_codes_and_lines_a_ci_user_sees(tmp_path: Path) -> None:
    for name, text in (("train.py", TRAINING_SCRIPT), ("sync.py", SYNC_IN_LOOP), ("crash.py", CRASH)):
        (tmp_path / name).write_text(text)
    ok = _check("train.py", "--max-step-time", "1s", "--max-hbm", "0.5", "--fail-on", "f64,host-sync", "--json",
                "--junit", "ok.xml", "--out", "ok", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    summary = json.loads(ok.stdout)                  # --json: stdout is the summary alone
    assert summary["status"] == "ok" and [c["passed"] for c in summary["checks"]] == [True] * 5
    report = json.loads((tmp_path / "ok" / "report.json").read_text())
    assert summary["modes"]["strict"]["step_time_s"] == report["modes"]["strict"]["step_time_median_s"]
    assert ET.parse(tmp_path / "ok.xml").getroot().find("testsuite").get("failures") == "0"

    slow = _check("train.py", "--max-step-time", "1ns", "--out", "slow", cwd=tmp_path)
    assert slow.returncode == 1
    assert "FAIL step-time[strict]: step time" in slow.stdout and "> budget 1 ns" in slow.stdout
    assert "tpusim check: failed (1 of 2 checks failed; exit code 1)" in slow.stdout
    assert "verdict (strict):" in slow.stdout and "whole-program totals:" not in slow.stdout   # issue 45: no table
    assert summary["modes"]["strict"]["hfu"] == report["modes"]["strict"]["hfu"]

    lint = _check("sync.py", "--fail-on", "f64,host-sync", "--out", "lint", cwd=tmp_path)
    assert lint.returncode == 1
    assert "PASS lint[float64]" in lint.stdout
    assert "FAIL lint[host-sync]: 1 host-sync finding(s): sync.py:7: host sync" in lint.stdout

    crash = _check("crash.py", "--junit", "crash.xml", "--out", "crash", cwd=tmp_path)
    assert crash.returncode == 3
    assert "FAIL script: crash.py: the script raised ValueError (ValueError: bad batch)" in crash.stdout
    assert 'raise ValueError(\'bad batch\')' in crash.stderr          # the script's own traceback
    failure = ET.parse(tmp_path / "crash.xml").getroot().find("testsuite/testcase/failure")
    assert failure.get("type") == "script"
