"""isend/irecv that complete when the peer posts the matching call, not at the call (--ranks all).

The ring pattern (every rank isends to the next, irecvs from the previous, then waits both) is what
pipeline parallelism, ring attention and batch_isend_irecv post; it used to be reported as an unmatched
send. The truth is the script's arithmetic, computed here on CPU: what each rank's left (or right)
neighbour sent."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from factories import launch_ranks

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"


def _launch(script: str, world: int, tmp_path: Path):
    return launch_ranks(SCRIPTS / script, world, tmp_path)


def _received(output: str, world: int) -> dict[int, list]:
    found = {}
    for rank in range(world):
        match = re.search(rf"^\[rank {rank}\] RECEIVED (.*)$", output, re.MULTILINE)
        assert match, output
        found[rank] = json.loads(match.group(1))
    return found


def test_a_ring_of_isend_then_irecv_completes_and_each_rank_gets_its_neighbours_tensor(tmp_path):
    import torch

    world = 3
    result, _, output = _launch("p2p_ring.py", world, tmp_path)
    assert result.ok, result.summary() + output
    assert "unmatched" not in output and "Traceback" not in output
    for rank, (got, back, busy) in _received(output, world).items():
        left, right = (rank - 1) % world, (rank + 1) % world
        assert got == (torch.arange(4.0) + 10 * left).tolist()              # isend to the right, irecv from the left
        assert back == (torch.arange(6.0).reshape(3, 2) + right).tolist()      # tag 7, the other way, into a .t() view
        assert busy == float((torch.arange(4.0) + 10 * rank).mul(2).sum())
    # the trace: isend/irecv recorded async (they overlap compute until their wait), dist.send/recv not
    for rank in (0, 1):
        lines = (tmp_path / f"rank{rank}.jsonl").read_text().splitlines()[1:]
        permutes = [r for r in map(json.loads, lines) if r.get("collective") == "permute"]
        assert [(p["async_op"], p["bytes"]) for p in permutes] == [(True, 16), (True, 16), (True, 24), (True, 24),
                                                                   (False, 8)]
    groups = [p["group"] for p in map(json.loads, (tmp_path / "rank0.jsonl").read_text().splitlines()[1:])
              if p.get("collective") == "permute"]
    assert groups == [[0, 1], [2, 0], [1, 0], [0, 2], [0, 1]]                 # (sender, receiver) of each message


def test_batch_isend_irecv_ring_both_directions_and_dtypes(tmp_path):
    import torch

    world = 3
    result, _, output = _launch("p2p_batch_ring.py", world, tmp_path)
    assert result.ok, result.summary() + output
    for rank, (floats, ints) in _received(output, world).items():
        left, right = (rank - 1) % world, (rank + 1) % world
        assert floats == (torch.arange(6.0).reshape(2, 3) + 100 * left).tolist()
        assert ints == [right, right * right]


def test_an_isend_nobody_receives_is_an_unmatched_send_once_the_ranks_wait(tmp_path):
    result, seconds, output = _launch("p2p_isend_unreceived.py", 2, tmp_path)
    assert result.exit_codes == [1, 1], result.summary() + output
    assert "[rank 0] POSTED" in output and "[rank 1] POSTED" in output      # the isend call did not block
    assert re.search(r"tpusim: unmatched send: rank (\d)'s isend\(float32\[4\]\) to rank (\d) at "
                     r"p2p_isend_unreceived.py:6 \(message #0 from rank \1 to rank \2\) is never received: rank \2 "
                     r"waits in isend\(float32\[4\]\) to rank \1 at p2p_isend_unreceived.py:6 instead",
                     result.summary()), result.summary()
    assert "Traceback" not in output and "Connection closed" not in output
    assert seconds < 60, f"took {seconds:.1f} s"       # the hang timeout is 300 s


def test_destroy_process_group_waits_for_an_isend_never_waited_for_and_names_it(tmp_path):
    result, seconds, output = _launch("p2p_isend_then_destroy.py", 2, tmp_path)
    assert "[rank 0] PASSED BARRIER" in output and "[rank 1] PASSED BARRIER" in output, output
    assert result.exit_codes == [1, 0], result.summary() + output
    assert ("tpusim: rank 1 finished the script without receiving the message of rank 0's isend(float32[4]) to "
            "rank 1 at p2p_isend_then_destroy.py:6 (message #0 from rank 0 to rank 1)") in result.summary()
    assert "Traceback" not in output and seconds < 60


# a rank ending its script without waiting for its isend: tests/distributed/test_p2p_exit.py


def test_tpusim_run_prices_an_exchange_whose_two_directions_differ_in_size(tmp_path):
    """Each side's n-th message on (sender, receiver) meets the other's: a send is never paired with the
    other rank's send of a different size (with the pair recorded as one sorted group it was)."""
    result = subprocess.run([sys.executable, "-m", "tpusim", "run", str(SCRIPTS / "p2p_exchange_sizes.py"),
                             "--topology", "2d:2x1", "--ranks", "all", "--quiet", "--out", str(tmp_path)],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "[rank 0] GOT 8.0" in result.stdout and "[rank 1] GOT 4.0" in result.stdout   # 8 ones in, 4 ones in
    report = json.loads((tmp_path / "report.json").read_text())
    runs = next(iter(report["modes"].values()))["collectives"]
    assert sorted((c["kind"], c["rank_bytes"], c["async"]) for c in runs) == [
        ("permute", 16, True), ("permute", 16, True), ("permute", 32, True), ("permute", 32, True)]


# -- in one process: the matching alone (shape-only messages, no gloo), ranks as threads -------------------------

def _rank_threads(world: int, body) -> tuple[dict[int, str], float]:
    import torch.distributed as dist

    from tpusim.backend.distributed.hang import Control
    from tpusim.backend.distributed.p2p import Outbox

    store = dist.HashStore()
    outcome: dict[int, str] = {}

    def run(rank: int) -> None:
        try:
            body(rank, Outbox(Control(store, rank)))
            outcome[rank] = "done"
        except Exception as e:  # noqa: BLE001 (the outcome is the test's subject)
            outcome[rank] = f"{type(e).__name__}: {e}"

    started = time.monotonic()
    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return outcome, time.monotonic() - started


def _message(kind: str, me: int, peer: int, shape: tuple[int, ...] = (4,)):
    from tpusim.backend.distributed.hang import Call
    from tpusim.backend.distributed.p2p import Message

    call = Call(kind, (shape,), "float32", "", -1, "ring.py:1", tuple(sorted((me, peer))), "p2p", 0, me, peer, 0, True)
    return Message(call, None, peer, None)


def test_posted_messages_match_whatever_order_the_ranks_wait_in():
    def ring(rank: int, outbox) -> None:
        sent = outbox.add(_message("send", rank, (rank + 1) % 4))
        received = outbox.add(_message("recv", rank, (rank - 1) % 4))
        for work in ((sent, received) if rank % 2 else (received, sent)):
            work.wait()
        assert sent.is_completed() and received.is_completed()

    outcome, _ = _rank_threads(4, ring)
    assert outcome == {0: "done", 1: "done", 2: "done", 3: "done"}


def test_two_sends_each_waiting_for_the_other_to_receive_are_a_deadlock_within_seconds():
    def both_send(rank: int, outbox) -> None:
        outbox.add(_message("send", rank, 1 - rank)).wait()

    outcome, seconds = _rank_threads(2, both_send)
    assert set(outcome) == {0, 1} and all(o.startswith("CollectiveMismatchError: tpusim: unmatched send: rank ")
                                          for o in outcome.values()), outcome
    assert seconds < 15


def test_sides_that_disagree_on_shape_are_reported_before_any_data_moves():
    def mismatched(rank: int, outbox) -> None:
        kind, shape = ("send", (4,)) if rank == 0 else ("recv", (5,))
        outbox.add(_message(kind, rank, 1 - rank, shape)).wait()

    outcome, _ = _rank_threads(2, mismatched)
    assert all("point-to-point mismatch at message #0 from rank 0 to rank 1" in o for o in outcome.values()), outcome


@pytest.mark.parametrize("api, blocks", [("send", True), ("isend", False)])
def test_a_blocking_send_is_told_apart_from_an_isend_by_its_caller(api, blocks):
    """dist.send is isend + wait(): the process group sees isend either way, the caller's frame says which."""
    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    from tpusim.backend.distributed.p2p import blocking_call

    seen = []

    class Probe(dist.ProcessGroup):
        def send(self, tensors, dst, tag):
            seen.append(blocking_call())
            raise RuntimeError("probe")

    with pytest.raises(RuntimeError, match="probe"):
        getattr(c10d, api)(torch.ones(1), group=Probe(0, 2), group_dst=1)
    assert seen == [blocks]
