"""How a `tpusim run` ends, end to end (issue 17, rows 3, 7, 8, 9): the script's exit status and Ctrl-C in
report.json, two runs into one --out, a --placement the recorded program cannot take. Each run is a
subprocess, as a user would start it (the same endings in-process, torch-free: tests/test_interrupts.py)."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def tpusim(*argv: str, cwd: Path = ROOT, **popen) -> subprocess.CompletedProcess:
    """The command as a user starts it; priced with --compiler model (these tests are about how a run ends,
    not about the TPU compiler, whose compiles in a fresh home cost seconds per test)."""
    if "--compiler" not in argv:
        argv = (argv[0], "--compiler", "model", *argv[1:])
    return subprocess.run([sys.executable, "-m", "tpusim", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=600, **popen)


def script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "script.py"
    path.write_text("import torch\nx = torch.ones(4, 4, device='tpu')\ny = (x @ x).sum()\n" + body)
    return str(path)


def report_of(out: Path) -> dict:
    return json.loads((out / "report.json").read_text())


def test_sys_exit_3_is_the_exit_status_and_the_report_says_so(tmp_path):
    result = tpusim("run", script(tmp_path, "import sys\nsys.exit(3)\n"), "--quiet", "--out", str(tmp_path / "out"))
    assert result.returncode == 3
    report = report_of(tmp_path / "out")
    assert report["exit_code"] == 3 and report["complete"] is False and report["error"] is None
    assert report["interrupted"] is None and report["program"]["ops"] >= 2
    assert "INCOMPLETE: the script exited with status 3" in result.stdout


def test_a_second_run_into_the_same_out_is_refused_and_the_first_is_untouched(tmp_path):
    started, go = tmp_path / "started", tmp_path / "go"
    body = (f"import pathlib, time\npathlib.Path({str(started)!r}).touch()\n"
            f"while not pathlib.Path({str(go)!r}).exists(): time.sleep(0.05)\n")
    out = tmp_path / "out"
    first = subprocess.Popen([sys.executable, "-m", "tpusim", "run", script(tmp_path, body), "--quiet",
                              "--out", str(out)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 300
        while not started.exists() and first.poll() is None and time.time() < deadline:
            time.sleep(0.1)
        assert started.exists(), first.communicate()[1]
        second = tpusim("run", "examples/mlp.py", "--quiet", "--out", str(out))
        assert second.returncode == 2
        assert second.stderr == (f"tpusim run: error: --out {str(out)!r} is being written by another tpusim run "
                                 f"right now; give this run its own --out (or wait for the other run to finish)\n")
    finally:
        go.touch()
        stdout, stderr = first.communicate(timeout=600)
    assert first.returncode == 0, stderr
    assert report_of(out)["complete"] and report_of(out)["run"]["script"].endswith("script.py")


def test_a_placement_the_program_cannot_take_keeps_the_report(tmp_path):
    result = tpusim("run", script(tmp_path, ""), "--quiet", "--topology", "2d:2x2", "--ranks", "one",
                    "--placement", "tp=x", "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert result.stderr.strip().endswith("this script recorded none (the report uses the default placement)")
    assert report_of(tmp_path / "out")["program"]["ops"] >= 2        # the run's work was not lost


def test_ctrl_c_during_pricing_of_a_real_run(tmp_path):
    """A real SIGINT from outside once pricing has started, then two more while the report is written."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:    # the run would inherit it, and tpusim respects it
        pytest.skip("SIGINT is ignored in this process (pytest started as a background job)")
    out = tmp_path / "out"
    run = subprocess.Popen([sys.executable, "-m", "tpusim", "run", "examples/mlp.py", "--mode", "all", "--out",
                            str(out), "--", "--steps", "60"], cwd=ROOT, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    lines = []
    for line in run.stderr:                                   # progress lines: "...; pricing debug, strict, fused"
        lines.append(line)
        if "pricing debug" in line:
            break
    for _ in range(3):
        run.send_signal(signal.SIGINT)
        time.sleep(0.05)
    stdout, stderr = run.communicate(timeout=600)
    stderr = "".join(lines) + stderr
    assert run.returncode == 130, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    report = report_of(out)
    assert report["interrupted"]["pricing"] is True and report["exit_code"] == 0
    assert set(report["modes"]) | set(report["interrupted"]["not_priced"]) == {"debug", "strict", "fused"}
    assert "INCOMPLETE: Ctrl-C stopped pricing" in stdout


@pytest.mark.slow      # about 17 s: a long recording to signal while it is priced
def test_sigterm_during_pricing_of_a_real_run_exits_143_within_a_container_grace_period(tmp_path):
    """Issue 44, I07: SIGTERM once pricing had begun printed "Ctrl-C: pricing stopped", exited 130, and took 34 s
    (writing program.jsonl through dataclasses.asdict, then compiling with XLA, neither stoppable): `docker stop`
    kills after 10 s. Now: 143, the signal's name, what it stopped and where the recording is, within 10 s."""
    out = tmp_path / "out"
    run = subprocess.Popen([sys.executable, "-m", "tpusim", "run", "examples/mlp.py", "--mode", "all", "--out",
                            str(out), "--", "--steps", "60"], cwd=ROOT, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    lines = []
    for line in run.stderr:                                   # progress lines: "...; pricing debug, strict, fused"
        lines.append(line)
        if "pricing debug" in line:
            break
    sent = time.monotonic()
    run.send_signal(signal.SIGTERM)
    stdout, stderr = run.communicate(timeout=600)
    took = time.monotonic() - sent
    stderr = "".join(lines) + stderr
    assert run.returncode == 143, stderr
    assert took < 10, f"{took:.1f} s from SIGTERM to exit"
    assert "Ctrl-C" not in stderr and "Traceback" not in stderr, stderr
    assert "SIGTERM: stopped pricing" in stderr and f"the recording is kept in {out / 'program.jsonl'}" in stderr
    report = report_of(out)
    assert report["interrupted"]["by"] == "SIGTERM" and report["interrupted"]["pricing"] is True
    assert (out / "program.jsonl").is_file() and "INCOMPLETE: SIGTERM stopped pricing" in stdout


def test_a_run_on_a_faulted_slice_reports_its_slowdown_against_the_healthy_one(tmp_path):
    body = ("import torch, torch.distributed as dist\n"
            "dist.init_process_group('tpusim')\n"
            "x = torch.ones(2**22, device='tpu')\n"
            "dist.all_reduce(x)\n")
    done = tpusim("run", script(tmp_path, body), "--topology", "3d:4x4x4", "--ranks", "one", "--quiet",
                  "--fail-links", "x+@(0,0,0)", "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    faults = report_of(tmp_path / "out")["faults"]
    assert faults["failed_links"] == ["x+@(0,0,0)"] and faults["links_working"] == 191
    strict = faults["modes"]["strict"]
    assert strict["total_s"] > strict["healthy_total_s"] and strict["slowdown"] > 1    # the 16 MB all-reduce detours
    assert "on the healthy slice" in done.stdout


def test_a_script_that_changes_folder_keeps_its_report_where_out_said(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    body = f"import os\nos.chdir({str(elsewhere)!r})\n"
    result = tpusim("run", script(tmp_path, body), "--quiet", "--out", "out", cwd=tmp_path)   # a relative --out
    assert result.returncode == 0, result.stderr
    assert report_of(tmp_path / "out")["complete"] is True
    assert not (elsewhere / "out").exists()
    assert f"report: {tmp_path / 'out'}/report.html" in result.stdout


def test_sigterm_while_the_script_runs_writes_the_report_of_what_was_recorded(tmp_path):
    """What a cancelled CI job, `timeout` or `docker stop` sends: the script stops as at Ctrl-C, what it
    recorded is priced and written, marked as stopped by SIGTERM; the exit status is the shell's 143."""
    started = tmp_path / "started"
    body = (f"import pathlib, time\nfor _ in range(3):\n    y = (x @ x).sum()\npathlib.Path({str(started)!r}).touch()\n"
            f"while True:\n    time.sleep(0.05)\n")
    out = tmp_path / "out"
    run = subprocess.Popen([sys.executable, "-m", "tpusim", "run", script(tmp_path, body), "--quiet", "--out",
                            str(out)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not started.exists() and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    run.send_signal(signal.SIGTERM)
    stdout, stderr = run.communicate(timeout=600)
    assert run.returncode == 143, stderr
    assert "Traceback" not in stderr
    report = report_of(out)
    assert report["interrupted"] == {"script": True, "pricing": False, "not_priced": [], "by": "SIGTERM"}
    assert report["exit_code"] == 143 and report["program"]["ops"] >= 4
    assert "INCOMPLETE: SIGTERM stopped the script" in stdout


def test_a_rerun_into_the_same_out_holds_only_its_own_files(tmp_path):
    # Issue 32, row 6: a rerun wrote its report.json beside the earlier run's trace.json and figures (the
    # summary pointed at them). Issue 44: only what the earlier run's manifest lists goes, once the new report
    # is written. The earlier run here wrote links.png and ranks/ too (as a run with links and --ranks all does).
    out = tmp_path / "out"
    first = tpusim("run", script(tmp_path, ""), "--quiet", "--out", str(out))
    assert first.returncode == 0, first.stderr
    assert "replaced" not in first.stderr
    manifest = json.loads((out / ".tpusim-run.json").read_text())
    assert "report.json" in manifest["files"] and "program.jsonl" in manifest["files"]
    (out / "links.png").write_bytes(b"old")
    (out / "ranks").mkdir()
    (out / "ranks" / "rank1.jsonl").write_bytes(b"")
    manifest["files"].append("links.png")
    manifest["folders"] = {"ranks": ["rank1.jsonl"]}
    (out / ".tpusim-run.json").write_text(json.dumps(manifest))
    (out / "notes.txt").write_text("mine")
    result = tpusim("run", script(tmp_path, ""), "--quiet", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "replaced an earlier run's report" in result.stderr and "ranks/" in result.stderr
    assert not (out / "links.png").exists() and not (out / "ranks").exists()
    assert (out / "notes.txt").read_text() == "mine"
    assert (out / "trace.json").stat().st_size > 2 and (out / "program.jsonl").stat().st_size > 0
    assert "links.png" not in json.loads((out / ".tpusim-run.json").read_text())["files"]


def test_files_no_tpusim_run_wrote_are_never_replaced(tmp_path):
    # Issue 44, rows DS1 and DS7: a folder of the user's holding a report.json, a report.html and a ranks/ of their
    # own lost them all (ranks/ recursively), and tpusim said it "replaced an earlier run's report". Now the run
    # is refused before the script runs, and everything stays.
    out = tmp_path / "project"
    (out / "ranks").mkdir(parents=True)
    (out / "ranks" / "team.csv").write_text("user,rank\n")
    (out / "report.html").write_text("<html>my site</html>")
    (out / "report.json").write_text('{"my": "own report"}')
    ran = tmp_path / "ran"
    result = tpusim("run", script(tmp_path, f"open({str(ran)!r}, 'w').close()\n"), "--quiet", "--out", str(out))
    assert result.returncode == 2
    assert result.stderr == (f"tpusim run: error: --out {str(out)!r} holds report.json, report.html, which no tpusim "
                             f"run wrote there (a run lists its files in .tpusim-run.json, and replaces only "
                             f"those); move them, or give another --out\n")
    assert not ran.exists()
    assert (out / "ranks" / "team.csv").read_text() == "user,rank\n"
    assert (out / "report.html").read_text() == "<html>my site</html>"
    assert sorted(p.name for p in out.iterdir()) == ["ranks", "report.html", "report.json"]


def test_a_failing_script_leaves_the_users_ranks_folder_and_a_crafted_manifest_names_nothing_else(tmp_path):
    # Issue 44, row DS5: a user's ranks/ was deleted before the script ran, and the script then failed. A
    # single-rank run never touches a ranks/ no run listed; a manifest listing the user's files (edited, or
    # crafted) is not believed for names tpusim never writes.
    out = tmp_path / "out"
    (out / "ranks").mkdir(parents=True)
    (out / "ranks" / "leaderboard.csv").write_text("a,1\n")
    (out / "src").mkdir()
    (out / "notes.txt").write_text("mine")
    (out / ".tpusim-run.json").write_text(json.dumps({"schema": "tpusim-run", "files": ["notes.txt", "../x"],
                                                      "folders": {"src": [], "ranks": ["leaderboard.csv/"]}}))
    result = tpusim("run", script(tmp_path, "raise ValueError('boom')\n"), "--quiet", "--out", str(out))
    assert result.returncode == 1, result.stderr
    assert "ValueError: boom" in result.stderr
    assert (out / "ranks" / "leaderboard.csv").read_text() == "a,1\n"
    assert (out / "src").is_dir() and (out / "notes.txt").read_text() == "mine"
    assert report_of(out)["error"]["type"] == "ValueError"


@pytest.mark.slow      # about 25 s: a --ranks all run of four processes
def test_ranks_all_writes_ranks_once_the_report_is_written_and_never_into_the_users_ranks(tmp_path):
    # Issue 44, rows DS1, DS5: --ranks all wrote each rank's trace into ranks/ (an earlier run's removed before the
    # script ran). A ranks/ of the user's refuses such a run before the script; an earlier run's is replaced by
    # this run's ranks/ (staged while the script ran), listed in the manifest.
    body = "import torch.distributed as dist\ndist.init_process_group('tpusim')\ndist.all_reduce(x)\n"
    out = tmp_path / "out"
    (out / "ranks").mkdir(parents=True)
    (out / "ranks" / "team.csv").write_text("mine")
    refused = tpusim("run", script(tmp_path, body), "--quiet", "--topology", "2d:2x1", "--ranks", "all",
                     "--out", str(out))
    assert refused.returncode == 2 and "holds ranks/, which no tpusim run wrote there" in refused.stderr
    assert [p.name for p in (out / "ranks").iterdir()] == ["team.csv"] and len(list(out.iterdir())) == 1
    (out / "ranks" / "team.csv").unlink()
    (out / "ranks").rmdir()
    for _ in range(2):                          # the second run replaces the first's ranks/
        result = tpusim("run", script(tmp_path, body), "--quiet", "--topology", "2d:2x1", "--ranks", "all",
                        "--out", str(out))
        assert result.returncode == 0, result.stderr
        assert sorted(p.name for p in (out / "ranks").iterdir()) == ["rank0.jsonl", "rank1.jsonl"]
        assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]
    assert json.loads((out / ".tpusim-run.json").read_text())["folders"] == {"ranks": ["rank0.jsonl", "rank1.jsonl"]}
    assert "replaced an earlier run's report" in result.stderr and "ranks/" in result.stderr


PRICING_CRASHES = """
import sys
import tpusim.pricing
def price(*args, **kwargs):
    raise TypeError("'NoneType' object is not subscriptable")
tpusim.pricing.price = price          # as a bad XLA cache entry or a tpusim bug made pricing raise
from tpusim.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_crash_while_pricing_keeps_the_recording_and_says_where(tmp_path):
    # Issue 44, problem 3: a crash while pricing (a bad XLA cache entry: TypeError) was a raw traceback after the
    # script ran and left --out empty: the recording was lost. Now program.jsonl is written before pricing, the
    # run says in one line what failed and where the recording is, and the traceback is kept beside it.
    from tpusim.trace.records import OpRecord, read_trace

    out = tmp_path / "out"
    first = tpusim("run", script(tmp_path, ""), "--quiet", "--out", str(out))       # an earlier run's report
    assert first.returncode == 0, first.stderr
    done = subprocess.run([sys.executable, "-c", PRICING_CRASHES, "run", "--compiler", "model",
                           script(tmp_path, "z = x + 1\n"), "--quiet", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert (f"tpusim run: error: pricing failed (TypeError: 'NoneType' object is not subscriptable); the recording "
            f"is kept in {out / 'program.jsonl'}; the traceback in {out / 'pricing-error.txt'}; no report was "
            f"written\n") in done.stderr
    trace = read_trace(out / "program.jsonl")
    assert sum(isinstance(r, OpRecord) for r in trace.records) >= 3        # this run's ops: the matmul, sum, add
    assert "TypeError" in (out / "pricing-error.txt").read_text()
    assert not (out / "report.json").exists()          # the earlier run's report went: one run's files per folder
    assert sorted(json.loads((out / ".tpusim-run.json").read_text())["files"]) == ["pricing-error.txt",
                                                                                  "program.jsonl"]


def test_os_exit_ends_the_script_not_the_run_and_check_checks_it(tmp_path):
    # Issue 32, row 2: os._exit() ended tpusim too: exit 0, an empty folder, and `tpusim check` passed.
    result = tpusim("run", script(tmp_path, "import os\nos._exit(5)\n"), "--quiet", "--out", str(tmp_path / "out"))
    assert result.returncode == 5
    report = report_of(tmp_path / "out")
    assert report["exit_code"] == 5 and report["complete"] is False and report["program"]["ops"] >= 2
    gate = tpusim("check", script(tmp_path, "import os\nos._exit(0)\n"), "--max-step-time", "1ns", "--out",
                  str(tmp_path / "checked"))
    assert gate.returncode == 1 and "FAIL" in gate.stdout, gate.stdout + gate.stderr


def test_a_forked_child_does_not_write_a_second_report(tmp_path):
    # Issue 32, row 6: a child forked without os._exit ran on into tpusim and wrote a report over the parent's.
    body = ("import os\npid = os.fork()\nif pid == 0:\n    print('child at the end')\n"
            "else:\n    os.waitpid(pid, 0)\n")
    result = tpusim("run", script(tmp_path, body), "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    assert "child at the end" in result.stdout
    assert result.stdout.count("report: ") == 1


def test_a_script_that_closes_stdout_still_gets_its_summary(tmp_path):
    # Issue 32, row 9: the summary died in "ValueError: I/O operation on closed file".
    result = tpusim("run", script(tmp_path, "import sys\nprint('bye')\nsys.stdout.close()\n"), "--out",
                    str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    assert "bye" in result.stdout and "report: " in result.stdout and "Traceback" not in result.stderr
    assert report_of(tmp_path / "out")["complete"] is True


def test_a_thread_of_the_script_that_never_ends_is_said_and_ctrl_c_ends_the_wait(tmp_path):
    """Issue 44, S08: after the summary tpusim waited, silent, for a non-daemon thread of the script (as python
    does). Now it says which thread it waits for, and Ctrl-C ends the wait at once with the report kept."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:    # the run would inherit it, and tpusim respects it
        pytest.skip("SIGINT is ignored in this process (pytest started as a background job)")
    body = "import threading\nthreading.Thread(target=threading.Event().wait, name='forever').start()\n"
    out = tmp_path / "out"
    run = subprocess.Popen([sys.executable, "-m", "tpusim", "run", script(tmp_path, body), "--quiet", "--compiler",
                            "model", "--out", str(out)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    lines = []
    for line in run.stderr:
        lines.append(line)
        if "waiting for it to end" in line:
            break
    assert "the script's thread 'forever' still runs (not daemon threads)" in "".join(lines), "".join(lines)
    assert report_of(out)["complete"] is True                 # written before the wait
    run.send_signal(signal.SIGINT)
    _, stderr = run.communicate(timeout=60)
    assert run.returncode == 130 and "stopped waiting for the script's threads" in stderr
    assert "Traceback" not in "".join(lines) + stderr
