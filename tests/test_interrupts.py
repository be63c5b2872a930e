"""Never a lost or corrupted report (issue 17, rows 3 and 7): files written whole under unique temporary
names, a report folder claimed by one run at a time, and Ctrl-C after the script (any number of times)
stops pricing but never the writing of the report. In-process and torch-free: Ctrl-C is a real SIGINT
this process sends itself at a chosen moment."""

import json
import os
import signal
import stat
import sys
import threading
from pathlib import Path

import pytest
from factories import training_trace

import tpusim.pricing
import tpusim.report
import tpusim.trace.records
from tpusim.errors import TpusimError
from tpusim.output import atomic_open, claim_folder, claim_new_folder, prepare_folder, write_atomic
from tpusim.report import load_report
from tpusim.run.options import RunOptions, modes_of
from tpusim.run.pipeline import Interrupts, Progress, _keep_recording, _price_and_report
from tpusim.script import ScriptOutcome, run_script
from tpusim.slice.topology import build_slice


@pytest.fixture(autouse=True)
def ctrl_c_reaches_python():
    """Python's own SIGINT handler for each test, even when pytest was started with SIGINT ignored (a
    background job of a shell script), where tpusim leaves Ctrl-C ignored too."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


# ---- atomic files ---------------------------------------------------------------------------------------


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "report.json"
    path.write_text("old")
    with pytest.raises(KeyboardInterrupt), atomic_open(path) as out:
        out.write("half of the new")
        raise KeyboardInterrupt
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["report.json"]


def test_an_atomic_file_gets_the_usual_permissions(tmp_path):
    write_atomic(tmp_path / "a.json", "{}")
    (tmp_path / "b.json").write_text("{}")
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == stat.S_IMODE((tmp_path / "b.json").stat().st_mode)


def test_concurrent_writers_of_one_name_never_mix(tmp_path):
    path = tmp_path / "program.jsonl"
    texts = [f"{n}\n" * 20_000 for n in range(8)]
    threads = [threading.Thread(target=write_atomic, args=(path, text)) for text in texts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert path.read_text() in texts                    # one writer's whole file, never a mix
    assert [p.name for p in tmp_path.iterdir()] == ["program.jsonl"]


def test_write_trace_and_figures_use_unique_temporary_names(tmp_path, monkeypatch):
    """The old fixed name `program.jsonl.tmp` let two runs delete each other's file (FileNotFoundError)."""
    seen = []
    real_open = os.open

    def spy(path, *args):
        seen.append(Path(path).name)
        return real_open(path, *args)
    monkeypatch.setattr(os, "open", spy)
    tpusim.trace.records.write_trace(training_trace(), tmp_path / "program.jsonl")
    tpusim.trace.records.write_trace(training_trace(), tmp_path / "program.jsonl")
    assert len(set(seen)) == 2 and all(name.startswith(".program.jsonl.") for name in seen)


# ---- one run per --out ----------------------------------------------------------------------------------

def test_a_second_run_into_a_claimed_folder_is_refused(tmp_path):
    first = claim_folder(prepare_folder(tmp_path / "out"))
    with pytest.raises(TpusimError, match="is being written by another tpusim run right now"):
        claim_folder(tmp_path / "out")
    first.release()
    claim_folder(tmp_path / "out").release()            # free again once the first run is done


def test_default_folders_of_runs_started_in_the_same_second_differ(tmp_path):
    base = tmp_path / "reports" / "mlp-3d_1x1x1-20260101-000000"
    claims = [claim_new_folder(base) for _ in range(3)]
    assert [c.folder.name for c in claims] == [base.name, f"{base.name}-2", f"{base.name}-3"]
    for claim in claims:
        claim.release()


# ---- Ctrl-C after the script ----------------------------------------------------------------------------

def ctrl_c() -> None:
    """What a terminal's Ctrl-C does to this process: SIGINT, handled at the next bytecode."""
    os.kill(os.getpid(), signal.SIGINT)


FINISHED = ScriptOutcome(exit_code=0)


def price_and_report(tmp_path, modes, interrupt_at_mode: int | None, interrupts_while_writing: int = 0,
                     outcome=FINISHED):
    """Run the pricing-and-report half of `tpusim run`, pressing Ctrl-C while mode number
    ``interrupt_at_mode`` is priced and ``interrupts_while_writing`` times while the report is written."""
    trace, slice_ = training_trace(), build_slice("3d:1x1x1")
    real_price, real_write = tpusim.pricing.price, tpusim.report.write_report
    calls = []

    def price(*args, **kwargs):
        calls.append(kwargs["mode"])
        if len(calls) - 1 == interrupt_at_mode:
            ctrl_c()
        return real_price(*args, **kwargs)

    def write_report(*args, **kwargs):
        for _ in range(interrupts_while_writing):
            ctrl_c()
        return real_write(*args, **kwargs)

    patch = pytest.MonkeyPatch()
    patch.setattr(tpusim.pricing, "price", price)
    patch.setattr(tpusim.report, "write_report", write_report)
    try:
        with Interrupts(Progress(quiet=True)) as interrupts:
            options = RunOptions(script="model.py", modes=modes_of(",".join(modes)))
            _keep_recording(trace, tmp_path)            # program.jsonl, before pricing (as run_pipeline does)
            _, measured, stopped = _price_and_report(trace, slice_, options, outcome, "2.x", tmp_path,
                                                     Progress(quiet=True), interrupts)
    finally:
        patch.undo()
    return stopped, load_report(tmp_path)[0]


def test_ctrl_c_during_pricing_reports_what_was_priced(tmp_path, capsys):
    stopped, report = price_and_report(tmp_path, ["debug", "strict", "fused"], interrupt_at_mode=1)
    assert stopped and list(report.modes) == ["debug"]
    assert report.complete is False and report.exit_code == 0
    assert report.to_dict()["interrupted"] == {"script": False, "pricing": True, "not_priced": ["strict", "fused"],
                                                "by": "Ctrl-C"}
    out = capsys.readouterr().out
    assert "INCOMPLETE: Ctrl-C stopped pricing (strict, fused not priced)" in out
    assert (tmp_path / "report.html").is_file() and (tmp_path / "program.jsonl").is_file()


def test_more_ctrl_c_while_the_report_is_written_change_nothing(tmp_path, capsys):
    stopped, report = price_and_report(tmp_path, ["debug", "strict"], interrupt_at_mode=1,
                                       interrupts_while_writing=5)
    assert stopped and list(report.modes) == ["debug"]
    err = capsys.readouterr().err
    assert err.count("Ctrl-C again changes nothing") == 1 and "Traceback" not in err
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler      # Python's handler is back


def test_ctrl_c_before_any_mode_is_priced_still_writes_a_report(tmp_path, capsys):
    stopped, report = price_and_report(tmp_path, ["strict"], interrupt_at_mode=0)
    assert stopped and report.modes == {} and report.interrupted.not_priced == ["strict"]
    out = capsys.readouterr().out
    assert "no eager mode was priced" in out
    # issue 44, E01: the summary named a trace.json that no run wrote
    assert "(report.json, no trace.json: no mode was priced)" in out and not (tmp_path / "trace.json").exists()
    assert "No eager mode was priced" in (tmp_path / "report.html").read_text()
    assert not list(tmp_path.glob("*.png"))


def test_a_script_stopped_by_ctrl_c_is_reported_as_interrupted(tmp_path, capsys):
    outcome = ScriptOutcome(exit_code=130, error="KeyboardInterrupt\n", error_type="KeyboardInterrupt")
    stopped, report = price_and_report(tmp_path, ["strict"], interrupt_at_mode=None, outcome=outcome)
    assert not stopped and report.exit_code == 130 and list(report.modes) == ["strict"]
    assert report.to_dict()["interrupted"] == {"script": True, "pricing": False, "not_priced": [],
                                                "by": "Ctrl-C"}
    assert "INCOMPLETE: Ctrl-C stopped the script;" in capsys.readouterr().out


@pytest.mark.parametrize("code, complete", [(0, True), (3, False)])
def test_the_exit_status_is_in_the_report(tmp_path, capsys, code, complete):
    _, report = price_and_report(tmp_path, ["strict"], interrupt_at_mode=None, outcome=ScriptOutcome(exit_code=code))
    assert report.exit_code == code and report.complete is complete and report.interrupted is None
    assert ("INCOMPLETE: the script exited with status 3" in capsys.readouterr().out) is not complete


def test_no_partial_files_after_an_interrupted_report(tmp_path, capsys):
    price_and_report(tmp_path, ["debug", "strict"], interrupt_at_mode=1, interrupts_while_writing=3)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    json.loads((tmp_path / "report.json").read_text())


# ---- how the script ends (tpusim/script.py), and a run with nothing recorded ------------------------------

@pytest.mark.parametrize("body, code, error_type", [
    ("import sys\nsys.exit(3)\n", 3, None),
    ("import sys\nsys.exit()\n", 0, None),
    ("import os, signal\nos.kill(os.getpid(), signal.SIGINT)\nprint('never')\n", 130, "KeyboardInterrupt"),
    ("raise RuntimeError('bug')\n", 1, "RuntimeError"),
])
def test_the_script_outcome_is_what_python_would_exit_with(tmp_path, capsys, body, code, error_type):
    script = tmp_path / "script.py"
    script.write_text(body)
    outcome = run_script(script, [])
    assert (outcome.exit_code, outcome.error_type) == (code, error_type)
    assert "never" not in capsys.readouterr().out


def test_a_run_with_no_ops_draws_its_figures_without_warnings(tmp_path, recwarn):
    from tpusim.eager.modes import get_mode
    from tpusim.pricing import price as real_price
    from tpusim.report import RunInfo, build_report, write_report
    from tpusim.trace.records import Trace

    slice_ = build_slice("3d:1x1x1")
    timelines = {"strict": real_price(Trace(records=()), topology=slice_, mode=get_mode("strict"))}
    write_report(tmp_path, build_report(RunInfo("empty.py"), Trace(records=()), slice_, timelines), timelines)
    assert (tmp_path / "breakdown.png").is_file()
    assert not [str(w.message) for w in recwarn], "matplotlib warned (e.g. an empty legend)"


def test_sigterm_during_pricing_stops_it_as_ctrl_c_does(tmp_path, capsys, monkeypatch):
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        monkeypatch.setattr(sys.modules[__name__], "ctrl_c", lambda: os.kill(os.getpid(), signal.SIGTERM))
        stopped, report = price_and_report(tmp_path, ["debug", "strict", "fused"], interrupt_at_mode=1)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert stopped and list(report.modes) == ["debug"]
    assert report.interrupted.by == "SIGTERM" and report.interrupted.pricing is True
    assert "INCOMPLETE: SIGTERM stopped pricing (strict, fused not priced)" in capsys.readouterr().out


def test_a_ctrl_c_during_the_numpy_import_arrives_after_it():
    # Issue 32, row 8: a Ctrl-C while torch imported numpy was swallowed in 3 of 13 tries and left numpy
    # half-initialised. tpusim run imports numpy with the signal held: it arrives, as KeyboardInterrupt, after.
    from tpusim.run.pipeline import _signals_held

    reached = []
    with pytest.raises(KeyboardInterrupt):
        with _signals_held():
            os.kill(os.getpid(), signal.SIGINT)
            reached.append("the block ran to its end")
    assert reached == ["the block ran to its end"]


def test_a_very_deep_traceback_is_cut_to_its_last_frames_at_once():
    # issue 44, S24: a RecursionError under sys.setrecursionlimit(10**7) gave no output in 150 s: the script's
    # traceback was summed up frame by frame (minutes, gigabytes). Python prints the last 1000 frames; so do we.
    # In a process of its own: so deep a recursion may overflow a test worker's C stack.
    import subprocess
    import textwrap

    from tpusim.script import MAX_FRAMES

    code = textwrap.dedent("""
        import sys
        from tpusim.script import user_traceback

        def down(n):
            return down(n + 1) + 1

        sys.setrecursionlimit(30_000)
        try:
            down(0)
        except RecursionError as error:
            caught = error
        sys.setrecursionlimit(1000)
        sys.stdout.write(user_traceback(caught))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    text = done.stdout
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"the last {MAX_FRAMES} are shown" in text and text.endswith("RecursionError: maximum recursion depth "
                                                                         "exceeded\n")
    assert f"[Previous line repeated {MAX_FRAMES - 3} more times]" in text     # Python's own summary of the rest
    assert text.count("\n") < 10 * MAX_FRAMES          # the last frames only, never one line per frame of 30,000
