"""Hang detection for point-to-point ops and Ctrl-C under ``--ranks all`` (issue 17, row 2).

Each case runs the rank processes as ``tpusim run --ranks all`` starts them (the launcher). The truth is
the script: which rank sends what to whom, and where it stops."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"


def _launch(script: str, tmp_path: Path, env: dict | None = None):
    import torch  # noqa: F401

    from tpusim.backend.distributed.launcher import launch

    stream = io.StringIO()
    started = time.monotonic()
    old = {k: os.environ.get(k) for k in env or {}}
    os.environ.update(env or {})
    try:
        result = launch(SCRIPTS / script, [], 2, 4, tmp_path, stream=stream)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return result, time.monotonic() - started, stream.getvalue()


@pytest.mark.parametrize("script, expected", [
    ("p2p_unreceived.py", ["unmatched send: rank 0's send(float32[4]) to rank 1 at p2p_unreceived.py:7",
                           "is never received", "rank 1 waits in barrier() at p2p_unreceived.py:8"]),
    ("p2p_early_exit.py", ["rank 1 finished the script without sending the message of rank 0's "
                           "recv(float32[4]) from rank 1 at p2p_early_exit.py:7"]),
    ("p2p_mismatch.py", ["point-to-point mismatch at message #0 from rank 0 to rank 1",
                         "rank 0 sends send(float32[4]) to rank 1 at p2p_mismatch.py:6",
                         "rank 1 receives recv(float32[5]) from rank 0 at p2p_mismatch.py:8"]),
])
def test_unmatched_point_to_point_ends_within_seconds_with_one_diagnosis(script, expected, tmp_path):
    result, seconds, output = _launch(script, tmp_path)
    assert not result.ok and any(result.exit_codes)
    summary = result.summary()
    for text in expected:
        assert text in summary, summary
    assert "Connection closed" not in output and "Traceback" not in output, output
    assert seconds < 60, f"took {seconds:.1f} s"       # the hang timeout is 300 s


def test_a_peer_still_computing_is_waited_for_and_said_not_to_be_a_deadlock(tmp_path):
    # the peer computes 5 s; the note comes after a quarter of the 12 s limit (3 s), the limit is not reached
    result, _, output = _launch("p2p_slow_peer.py", tmp_path, env={"TPUSIM_HANG_TIMEOUT_S": "12"})
    assert result.ok, result.summary() + output
    assert "[rank 1] RECEIVED [0.0, 3.0, 6.0, 9.0] [7.0, 7.0]" in output     # what rank 0 sent, tags kept apart
    assert re.search(r"rank 0 has waited \d+ s in send\(float32\[4\]\) to rank 1 at p2p_slow_peer.py:8 for "
                     r"rank 1, which is still computing \(not a deadlock", output), output
    assert "deadlock:" not in output and "unmatched" not in output


def test_ctrl_c_stops_every_rank_and_keeps_their_traces(tmp_path):
    code = ("import signal, sys, torch; from pathlib import Path\n"
            "signal.signal(signal.SIGINT, signal.default_int_handler)\n"   # a terminal's Ctrl-C, however pytest started
            "from tpusim.backend.distributed.launcher import launch\n"
            f"r = launch(Path({str(SCRIPTS / 'forever.py')!r}), [], 2, 4, Path({str(tmp_path)!r}))\n"
            "print('RESULT', r.interrupted, r.exit_codes, r.summary(), flush=True)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    ready = 0
    for line in proc.stdout:
        ready += "ready" in line
        if ready == 2:
            break
    proc.send_signal(signal.SIGINT)         # as the terminal's Ctrl-C: to the launcher, not the ranks' session
    out = proc.stdout.read()
    proc.wait(timeout=120)
    assert proc.returncode == 0 and "Traceback" not in out, out
    assert "RESULT True [130, 130] tpusim: interrupted (Ctrl-C): every rank was stopped" in out, out
    for rank in range(2):
        header = json.loads((tmp_path / f"rank{rank}.jsonl").read_text().splitlines()[0])
        assert header["rank"] == rank


@pytest.mark.slow
def test_tpusim_run_reports_an_unmatched_send_and_writes_the_report(tmp_path):
    result = subprocess.run([sys.executable, "-m", "tpusim", "run", str(SCRIPTS / "p2p_unreceived.py"),
                             "--topology", "2d:2x1", "--ranks", "all", "--quiet", "--out", str(tmp_path)],
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 1, result.stderr[-2000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["complete"] is False and "unmatched send" in report["error"]["traceback"]


def test_ranks_stopped_part_way_are_cut_to_the_collectives_every_rank_reached():
    from factories import toy_chip

    from tpusim.backend.distributed.runner import common_prefix
    from tpusim.errors import TpusimError
    from tpusim.pricing import price
    from tpusim.slice.topology import build_slice
    from tpusim.trace.records import CollectiveRecord, OpRecord, Trace, renumber

    def op(rank: int) -> OpRecord:
        return OpRecord(seq=0, op="aten::add", unit="vpu", dtype="float32", flops=1e6, rank=rank)

    def all_reduce(rank: int) -> CollectiveRecord:
        return CollectiveRecord(seq=0, collective="all_reduce", bytes=1 << 20, rank=rank)

    rank0 = Trace((op(0), all_reduce(0), op(0), all_reduce(0), op(0), all_reduce(0)), world_size=2, rank=0)
    rank1 = Trace((op(1), all_reduce(1), op(1)), world_size=2, rank=1)   # Ctrl-C reached it one call earlier
    slice_ = build_slice("3d:2x1x1", chip=toy_chip())

    def merged(traces: list[Trace]) -> Trace:
        return Trace(renumber([r for t in traces for r in t.records]), world_size=2)

    with pytest.raises(TpusimError, match="never reached it"):
        price(merged([rank0, rank1]), topology=slice_)
    cut, dropped = common_prefix([rank0, rank1], 2)
    assert [len(t.records) for t in cut] == [3, 3] and dropped == 3
    timeline = price(merged(cut), topology=slice_)
    assert len(timeline.collectives) == 2            # the one all-reduce both ranks reached, on each rank


def test_a_sub_group_whose_ranks_are_not_0_to_n_meets_in_the_control_store():
    """Ranks {0, 2} of a 2 x 2 mesh (an FSDP x TP column) publish and wait under their positions in the
    group; keyed by global rank, rank 2 was looked for as member 1 and both waited forever."""
    import threading

    import torch.distributed as dist

    from tpusim.backend.distributed.hang import Call, Control

    store = dist.HashStore()
    done: list[int] = []

    def member(rank: int) -> None:
        call = Call("all_reduce", ((4,),), "float32", "sum", -1, "x.py:1", (0, 2), "col", 0, rank)
        Control(store, rank).arrive(call, 2)
        done.append(rank)

    threads = [threading.Thread(target=member, args=(r,), daemon=True) for r in (0, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert sorted(done) == [0, 2]


def test_sigterm_under_ranks_all_stops_every_rank_and_writes_the_report(tmp_path):
    # Issue 32, row 1: a cancelled CI job (SIGTERM) under --ranks all lost the whole run: exit 143, no message,
    # only ranks/ in the report folder.
    proc = subprocess.Popen([sys.executable, "-m", "tpusim", "run", str(SCRIPTS / "forever.py"), "--topology",
                             "2d:1x2", "--ranks", "all", "--quiet", "--compiler", "model", "--out", str(tmp_path)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ready = 0
    for line in proc.stdout:
        ready += "ready" in line
        if ready == 2:
            break
    proc.send_signal(signal.SIGTERM)
    out = proc.stdout.read()
    proc.wait(timeout=120)
    assert proc.returncode == 143 and "Traceback" not in out, out
    assert "interrupted (SIGTERM): every rank was stopped" in out
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["interrupted"]["by"] == "SIGTERM" and report["exit_code"] == 143
