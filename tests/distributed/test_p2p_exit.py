"""isend/irecv never waited for when a script ends without destroy_process_group() (``--ranks all``), and
recv under ``--ranks one`` (the symmetry rule, never uninitialised memory).

At a rank's normal exit its open messages are finished (worker.finish_messages): they move, or the one
whose peer never posts is named, exit 1, within seconds (the hang timeout is 300 s). The truth for received
values is the scripts' arithmetic computed here on CPU."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

from factories import launch_ranks

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"


def _launch(script: str, world: int, tmp_path: Path):
    return launch_ranks(SCRIPTS / script, world, tmp_path)


def _run(script: str, topology: str, ranks: str, out: Path) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "tpusim", "run", str(SCRIPTS / script), "--topology", topology,
                             "--ranks", ranks, "--quiet", "--out", str(out)],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    return result, time.monotonic() - started


def test_an_isend_never_received_when_the_script_ends_without_destroy_is_named_exit_1_report_written(tmp_path):
    result, seconds = _run("p2p_exit_unreceived.py", "2d:2x1", "all", tmp_path)
    out = result.stdout + result.stderr
    assert result.returncode == 1, out[-3000:]
    assert "[rank 0] DONE" in out and "[rank 1] DONE" in out                # the script itself ran to its end
    assert ("tpusim: rank 1 finished the script without receiving the message of rank 0's isend(float32[4]) to "
            "rank 1 at p2p_exit_unreceived.py:6 (message #0 from rank 0 to rank 1)") in out, out[-3000:]
    assert "Traceback" not in out and "Connection closed" not in out
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["complete"] is False and "finished the script without receiving" in report["error"]["traceback"]
    assert seconds < 60, f"took {seconds:.1f} s"                              # not the 300 s hang timeout


def test_a_ring_whose_isends_are_never_waited_for_completes_at_exit(tmp_path):
    import torch

    world = 3
    result, seconds, output = _launch("p2p_exit_ring.py", world, tmp_path)
    assert result.ok and result.exit_codes == [0] * world, result.summary() + output
    assert "unmatched" not in output and "finished the script" not in output and "Traceback" not in output
    for rank in range(world):
        match = re.search(rf"^\[rank {rank}\] RECEIVED (.*)$", output, re.MULTILINE)
        assert match, output
        assert json.loads(match.group(1)) == (torch.arange(4.0) + 10 * ((rank - 1) % world)).tolist()
    assert seconds < 60


def test_an_isend_never_waited_for_moves_at_exit_to_a_peer_that_receives_later(tmp_path):
    """Rank 0 isends and ends its script at once; rank 1 irecvs a second later and gets the data (the message
    used to be dropped, and rank 1 stopped with 'rank 0 finished the script before its side ... moved')."""
    result, _, output = _launch("p2p_exit_without_wait.py", 2, tmp_path)
    assert result.ok and result.exit_codes == [0, 0], result.summary() + output
    assert "[rank 1] GOT [1.0, 1.0, 1.0, 1.0]" in output, output
    assert "Connection closed" not in output and "Traceback" not in output


def test_finishing_messages_at_exit_costs_nothing_without_messages(monkeypatch):
    """No open message (none sent, or all waited): the drain contacts nobody; a failed script is left alone."""
    import torch  # noqa: F401

    from tpusim.backend.distributed import p2p, process_group, worker
    from tpusim.script import ScriptOutcome

    class Unreachable:
        rank = 0

        def __getattr__(self, name: str):
            raise AssertionError(f"the control store was used ({name}) with no message open")

    monkeypatch.setattr(process_group, "CONTROL", Unreachable())
    monkeypatch.setattr(p2p, "_OUTBOX", None)
    ok = ScriptOutcome(exit_code=0)
    assert worker.finish_messages(ok) is ok
    waited = p2p.Outbox.__new__(p2p.Outbox)              # messages sent, every one waited already
    waited.open = []
    monkeypatch.setattr(p2p, "_OUTBOX", waited)
    assert worker.finish_messages(ok) is ok
    failed = ScriptOutcome(exit_code=1, error="boom\n", error_type="RuntimeError")
    outbox = p2p.Outbox.__new__(p2p.Outbox)               # an open message that would block if waited
    outbox.open = [object()]
    monkeypatch.setattr(p2p, "_OUTBOX", outbox)
    assert worker.finish_messages(failed) is failed


# -- --ranks one: a recv follows the symmetry rule ---------------------------------------------------------------

def test_ranks_one_ring_receives_this_ranks_own_send_and_the_caveat_names_recv(tmp_path):
    import torch

    result, _ = _run("p2p_ring_ranks_one.py", "2d:2x2", "one", tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    match = re.search(r"^RECEIVED (.*)$", result.stdout, re.MULTILINE)
    assert match, result.stdout[-2000:]
    got, back, lonely = json.loads(match.group(1))
    assert got == (torch.arange(4.0) + 10).tolist()                    # the value at the isend, not after add_
    assert back == torch.arange(6.0).reshape(2, 3).tolist()            # irecv before the isend: filled at wait()
    assert lonely == [0.0] * 5                                          # no matching send: zeros, not NaN
    assert "--ranks one: values after recv follow the symmetry rule" in result.stdout + result.stderr
    dist = json.loads((tmp_path / "report.json").read_text())["distributed"]
    recvs = [e for e in dist["not_reference_correct"] if e["kind"] == "recv"]
    assert sorted(e["source"] for e in recvs) == ["p2p_ring_ranks_one.py:12", "p2p_ring_ranks_one.py:17",
                                                  "p2p_ring_ranks_one.py:21"]
    assert all("matching exchange" in e["why"] for e in recvs)
    assert "recv from rank s = what rank 0 itself sent to rank n-s" in dist["numerics_rule"]


def test_the_mirror_pairs_the_kth_recv_with_the_kth_send_and_keeps_a_bounded_number_of_copies():
    import torch

    from tpusim.backend.distributed.numerics import Mirror

    mirror, ring, other = Mirror(), (1, 0), (1, 5)                    # (offset, tag)
    sent = torch.arange(3.0)
    mirror.send(ring, sent)
    sent.add_(100)                                                     # after the send: not what left
    first = torch.full((3,), float("nan"))
    mirror.fill(ring, mirror.recv(ring), first)
    assert first.tolist() == [0.0, 1.0, 2.0]
    wrong = torch.full((3,), 7, dtype=torch.int64)                     # the k-th send is float: zeros
    mirror.send(ring, torch.ones(3))
    mirror.fill(ring, mirror.recv(ring), wrong)
    assert wrong.tolist() == [0, 0, 0]
    untagged = torch.full((3,), float("nan"))                          # another tag is another channel
    mirror.fill(other, mirror.recv(other), untagged)
    assert untagged.tolist() == [0.0, 0.0, 0.0]
    only_sends = (2, 0)
    for k in range(Mirror.KEEP + 3):                                   # a rank that only sends keeps KEEP copies
        mirror.send(only_sends, torch.full((2,), float(k)))
    assert len(mirror._sent[only_sends]) == Mirror.KEEP
    late = [torch.full((2,), float("nan")) for _ in range(Mirror.KEEP + 4)]
    for t in late:
        mirror.fill(only_sends, mirror.recv(only_sends), t)
    # recv #k meets send #k: the first three were dropped (zeros), the next KEEP kept, one more never made
    assert [t[0].item() for t in late] == [0.0] * 3 + [float(k) for k in range(3, Mirror.KEEP + 3)] + [0.0]
