"""Hang detection for ``--ranks all``: every collective is fingerprinted and compared across ranks first.

Before a collective moves any data, each member publishes its fingerprint (kind, group, input
shapes, dtype, reduction, root, call site) to a shared TCPStore under (group, call number) and
waits for the other members' fingerprints. Then:

- all fingerprints agree (the call site is reported, never compared: MPMD code may call the same
  collective from different lines) -> the collective runs;
- they disagree (different order, different shapes, a rank skipped a call) -> every member raises
  ``CollectiveMismatchError`` with the same message naming the ranks, the calls and their lines;
- a member never arrives: its status in the store says why, and the waiters stop at once when it
  finished the script, crashed, or stopped on its own diagnosis; when it is blocked in a *different*
  collective that needs one of the waiting ranks (a wait cycle, stable for ``TPUSIM_HANG_GRACE_S``,
  default 1 s), that is a deadlock; when
  it is still computing, the waiters say so once after ``NOTE_AFTER_S`` (not a deadlock) and give up
  after ``TPUSIM_HANG_TIMEOUT_S`` (default 300 s).

Point-to-point ops (send, recv, isend, irecv) are fingerprinted the same way, per message: the n-th
send from rank a to rank b with a tag in a process group meets the n-th recv at b from a with that tag
in that group (as in gloo, whose messages are per group). Each side publishes its call when it is
made (``publish``) and its data moves only once the other side's call is there and agrees
(``counterpart``; p2p.py posts it to gloo then). A message completes when both
sides have posted it, not at the call, so the ring pattern (each rank isends to the next, irecvs from
the previous, then waits both) runs. Only when a rank blocks (``block``: a work's wait(), which
dist.send and dist.recv do at once) is it diagnosed: a send nobody receives (the receiver waits in a
collective, or in its own send, that needs the sender: a wait cycle), a recv from a rank that finished
or crashed, and sides that disagree on shape or dtype stop with one message naming the unmatched
call, instead of gloo blocking until its timeout or failing with "Connection closed by peer". While a
rank waits in a collective or a message, its posted messages keep moving (``Control.tick``).

The first diagnosis is also written to the store key ``diagnosis`` so the launcher prints it once. Every
control value is signed with the run's secret (control_store.py): one another process wrote is read as absent.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import torch.distributed as dist

from tpusim import envvars
from tpusim.backend.distributed.control_store import SignedStore

POLL_S = 0.005
STATUS_EVERY_S = 0.25
NOTE_AFTER_S = 10.0          # a wait this long (or a quarter of the timeout) on a peer still computing is said once
P2P = ("send", "recv")


class CollectiveMismatchError(RuntimeError):
    """Ranks disagree about a collective (or one will never arrive): the run cannot go on."""


@dataclass(frozen=True)
class Call:
    """One rank's view of one collective call."""

    kind: str
    shapes: tuple[tuple[int, ...], ...]
    dtype: str
    op: str
    root: int
    source: str
    group: tuple[int, ...]
    group_name: str
    seq: int
    rank: int
    peer: int = -1                      # send/recv: the other side's global rank
    tag: int = 0                        # send/recv: the message tag
    nonblocking: bool = False           # send/recv: isend/irecv (named so in messages)

    @property
    def p2p(self) -> bool:
        return self.kind in P2P

    def signature(self) -> tuple:
        """What must agree across the group's members (for send/recv: between the two sides)."""
        if self.p2p:
            return self.shapes, self.dtype, self.tag
        shapes = () if self.kind in ("all_to_all",) else self.shapes
        return self.kind, shapes, self.dtype, self.op, self.root

    def describe(self) -> str:
        parts = [f"{self.dtype}{list(s)}" for s in self.shapes]
        where = self.source or "unknown line"
        if self.p2p:
            side = "to" if self.kind == "send" else "from"
            tag = [f"tag {self.tag}"] if self.tag else []
            name = f"i{self.kind}" if self.nonblocking else self.kind
            return f"{name}({', '.join(parts + tag)}) {side} rank {self.peer} at {where}"
        parts += [self.op] if self.op else []
        parts += [f"root {self.root}"] if self.root >= 0 else []
        return f"{self.kind}({', '.join(parts)}) at {where}"

    def where(self) -> str:
        if self.p2p:
            src, dst = self.channel()
            return f"message #{self.seq} from rank {src} to rank {dst}"
        return f"call #{self.seq} on group {list(self.group)}, c10d group name {self.group_name!r}"

    def channel(self) -> tuple[int, int]:
        """(sender, receiver) of a send/recv, as global ranks."""
        return (self.rank, self.peer) if self.kind == "send" else (self.peer, self.rank)

    def key(self, side: str | None = None) -> str:
        """The store key of a send/recv's fingerprint (``side``: "send" or "recv"; default: this call's)."""
        src, dst = self.channel()
        return f"p2p/{self.group_name}/{src}>{dst}/{self.tag}/{self.seq}/{side or self.kind}"

    def counterpart(self) -> str:
        """The store key the other side of this send/recv publishes."""
        return self.key("recv" if self.kind == "send" else "send")

    def dumps(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def loads(text: str | bytes) -> Call:
        data = json.loads(text)
        data["shapes"] = tuple(tuple(s) for s in data["shapes"])
        data["group"] = tuple(data["group"])
        return Call(**data)


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(str(r) for r in sorted(ranks))


def mismatch_message(calls: list[Call]) -> str:
    """One message for a group whose members disagree; the same text on every rank."""
    by_sig: dict[tuple, list[Call]] = {}
    for c in sorted(calls, key=lambda c: c.rank):
        by_sig.setdefault(c.signature(), []).append(c)
    parts = sorted(by_sig.values(), key=lambda cs: (-len(cs), cs[0].rank))
    first = calls[0]
    lines = [f"tpusim: collective mismatch at {first.where()}: the ranks called different collectives "
             f"(a rank skipped one, or called them in a different order or with different shapes):"]
    for cs in parts:
        sources = sorted({c.source for c in cs})
        lines.append(f"  {_ranks([c.rank for c in cs])}: {cs[0].describe().rsplit(' at ', 1)[0]} at "
                     f"{', '.join(s or 'unknown line' for s in sources)}")
    return "\n".join(lines)


def unmatched_message(waiting: Call, blocked: Call) -> str:
    """A wait cycle through a send/recv: rank A waits in ``waiting`` while rank B waits in ``blocked``,
    which needs A. Named after the unmatched send or recv (the one whose other side is never called)."""
    p2p, other = (blocked, waiting) if blocked.p2p else (waiting, blocked)
    if p2p.kind == "send":
        head = f"unmatched send: rank {p2p.rank}'s {p2p.describe()} ({p2p.where()}) is never received"
    else:
        head = f"unmatched recv: rank {p2p.rank}'s {p2p.describe()} ({p2p.where()}) is never sent"
    return (f"tpusim: {head}: rank {other.rank} waits in {other.describe()} instead, which needs rank {p2p.rank} "
            f"(a deadlock: neither can go on)")


class Control:
    """This rank's side of the shared control store: fingerprints, status, the first diagnosis."""

    def __init__(self, store: dist.Store, rank: int, secret: str = "") -> None:
        self.store = SignedStore(store, secret)     # a value another process wrote is read as absent
        self.rank = rank
        self.timeout_s = envvars.read("TPUSIM_HANG_TIMEOUT_S")
        self.grace_s = envvars.read("TPUSIM_HANG_GRACE_S")
        self.last: Call | None = None
        self.tick: Callable[[], None] | None = None              # moves posted messages on while blocked (p2p.py)
        self._messages: dict[tuple[str, int, int, int], int] = {}   # (group, src, dst, tag) -> messages so far
        self._exited_at: dict[int, float] = {}                    # peer -> when it was first seen exited

    # -- status --------------------------------------------------------------------------------------
    def set_status(self, state: str, detail: str = "") -> None:
        self.store.set(f"status/{self.rank}", json.dumps({"state": state, "detail": detail,
                                                           "last": self.last.dumps() if self.last else ""}))

    def status_of(self, rank: int) -> dict:
        value = self.store.read(f"status/{rank}")
        return {"state": "starting", "detail": "", "last": ""} if value is None else json.loads(value)

    def fail(self, text: str) -> CollectiveMismatchError:
        first = self.store.set_first("diagnosis", text).decode()
        self.set_status("failed", first)
        return CollectiveMismatchError(first)

    # -- one collective ------------------------------------------------------------------------------
    def arrive(self, call: Call, group_ranks: int) -> None:
        """Publish ``call``, wait for the other members' calls and compare; raise on any disagreement."""
        base = f"fp/{call.group_name}/{call.seq}"
        self.store.set(f"{base}/{call.group.index(call.rank)}", call.dumps())   # keyed by position in the group
        self.last = call
        self.set_status("blocked", call.dumps())
        keys = [f"{base}/{r}" for r in range(group_ranks)]
        began = time.monotonic()
        next_status = began + STATUS_EVERY_S
        stuck_since: dict[int, tuple[str, float]] = {}
        noted = False
        sleep = POLL_S
        while (values := self.store.read_all(keys)) is None:
            if self.tick is not None:
                self.tick()
            now = time.monotonic()
            if now >= next_status:
                next_status = now + STATUS_EVERY_S
                noted = self._check_missing(call, keys, stuck_since, now, began, noted)
            time.sleep(sleep)
            sleep = min(sleep * 1.5, 0.05)
        calls = [Call.loads(v) for v in values]
        if len({c.signature() for c in calls}) > 1:
            raise self.fail(mismatch_message(calls))
        self.set_status("running")

    def _waits_on(self, other: Call, blocked: list[int]) -> bool:
        """True when ``other`` needs a rank of ``blocked`` that has not arrived at it (a wait cycle)."""
        if other.p2p:
            return other.peer in blocked and not self.store.check([other.counterpart()])
        base = f"fp/{other.group_name}/{other.seq}"
        return any(r in blocked and not self.store.check([f"{base}/{i}"]) for i, r in enumerate(other.group))

    # -- one point-to-point message ------------------------------------------------------------------
    def publish(self, call: Call) -> Call:
        """Publish this side of a send/recv at its call; returns it numbered on its channel (``seq``)."""
        src, dst = call.channel()
        n = self._messages.get((call.group_name, src, dst, call.tag), 0)
        self._messages[(call.group_name, src, dst, call.tag)] = n + 1
        call = replace(call, seq=n)
        self.store.set(call.key(), call.dumps())
        self.last = call
        return call

    def counterpart(self, call: Call) -> Call | None:
        """The other side of a published send/recv once it is there (None before); raises when it disagrees."""
        value = self.store.read(call.counterpart())
        if value is None:
            return None
        other = Call.loads(value)
        if other.signature() != call.signature():
            send, recv = (call, other) if call.kind == "send" else (other, call)
            raise self.fail(f"tpusim: point-to-point mismatch at {call.where()}: rank {send.rank} sends "
                            f"{send.describe()} but rank {recv.rank} receives {recv.describe()} (the two sides "
                            f"must agree on shape and dtype)")
        return other

    def block(self, call: Call, done: Callable[[], bool]) -> None:
        """Wait in a published send/recv until ``done()`` (the data has moved), reading as blocked in it;
        raise when the other side never comes (its rank finished, crashed, or waits on this one)."""
        self.last = call
        self.set_status("blocked", call.dumps())
        began = time.monotonic()
        next_status = began + STATUS_EVERY_S
        stuck_since: dict[int, tuple[str, float]] = {}
        noted = False
        sleep = POLL_S
        try:
            while True:
                if self.tick is not None:
                    self.tick()
                if done():
                    return
                now = time.monotonic()
                if now >= next_status:
                    next_status = now + STATUS_EVERY_S
                    if self.store.check([call.counterpart()]):
                        self._check_posted_peer(call, now, began)
                    else:
                        noted = self._check_peer(call, stuck_since, now, began, noted)
                time.sleep(sleep)
                sleep = min(sleep * 1.5, 0.05)
        finally:
            self.set_status("running")

    def _check_posted_peer(self, call: Call, now: float, began: float) -> None:
        """One look at the peer of a matched message still moving (its rank posts it at its next call or
        wait): stop when that rank is gone, or after the hang timeout."""
        if (diagnosis := self.store.read("diagnosis")) is not None:
            raise self.fail(diagnosis.decode())
        if self.status_of(call.peer)["state"] == "exited":
            gone = self._exited_at.setdefault(call.peer, now)
            if now - gone < self.grace_s:      # its data may still be on the way
                return
        text = self.peer_gone(call)
        if text:
            raise self.fail(text)
        if now - began > self.timeout_s:
            raise self.fail(f"tpusim: rank {call.peer} called its side of rank {call.rank}'s {call.describe()} "
                            f"({call.where()}) but did not move it within {self.timeout_s:.0f} s (it posts the message "
                            f"at its next torch.distributed call or wait(); TPUSIM_HANG_TIMEOUT_S sets the limit)")

    def peer_gone(self, call: Call) -> str:
        """Why the other side of a matched send/recv will never move it ("" while its rank is alive)."""
        st = self.status_of(call.peer)
        if st["state"] == "crashed":
            return (f"tpusim: rank {call.peer} crashed ({st['detail']}); rank {call.rank} waits in "
                    f"{call.describe()} ({call.where()}) and was stopped")
        if st["state"] == "failed":
            return st["detail"]
        if st["state"] == "exited":
            return (f"tpusim: rank {call.peer} finished the script before its side of rank {call.rank}'s "
                    f"{call.describe()} ({call.where()}) moved: it never waited for that message (call "
                    f"wait() on the work its isend/irecv returned, or destroy_process_group(), before the script ends)")
        return ""

    def _check_peer(self, call: Call, stuck_since: dict, now: float, began: float, noted: bool) -> bool:
        """One look at the peer of a send/recv that has not arrived; raise when it never will."""
        if (diagnosis := self.store.read("diagnosis")) is not None:
            raise self.fail(diagnosis.decode())
        peer, me = call.peer, call.rank
        st = self.status_of(peer)
        state, detail = st["state"], st["detail"]
        wanted = "receiving" if call.kind == "send" else "sending"
        if state == "exited":
            raise self.fail(f"tpusim: rank {peer} finished the script without {wanted} the message of rank {me}'s "
                            f"{call.describe()} ({call.where()}); rank {peer}'s last collective: "
                            f"{Call.loads(st['last']).describe() if st['last'] else 'none'}")
        if state == "crashed":
            raise self.fail(f"tpusim: rank {peer} crashed ({detail}); rank {me} waits in {call.describe()} "
                            f"({call.where()}) and was stopped")
        if state == "failed":
            raise self.fail(detail)
        if state == "blocked":
            seen = stuck_since.get(peer)
            if seen is None or seen[0] != detail:
                stuck_since[peer] = (detail, now)
            elif now - seen[1] >= self.grace_s:
                other = Call.loads(detail)
                if self._waits_on(other, [me]):
                    raise self.fail(unmatched_message(call, other))
        else:
            stuck_since.pop(peer, None)
        if now - began > self.timeout_s:
            raise self.fail(f"tpusim: rank {peer} (last collective: "
                            f"{Call.loads(st['last']).describe() if st['last'] else 'none'}) did not reach the other "
                            f"side of rank {me}'s {call.describe()} ({call.where()}) within {self.timeout_s:.0f} s "
                            f"(TPUSIM_HANG_TIMEOUT_S sets the limit)")
        if not noted and state == "running" and now - began > min(NOTE_AFTER_S, self.timeout_s / 4):
            print(f"tpusim: rank {me} has waited {now - began:.0f} s in {call.describe()} for rank {peer}, which "
                  f"is still computing (not a deadlock; the wait stops after TPUSIM_HANG_TIMEOUT_S="
                  f"{self.timeout_s:.0f} s)", file=sys.stderr, flush=True)
            return True
        return noted

    def _check_missing(self, call: Call, keys: list[str], stuck_since: dict, now: float, began: float,
                       noted: bool = False) -> bool:
        """One look at the members that have not arrived; raise when one never will. Returns ``noted``."""
        if (diagnosis := self.store.read("diagnosis")) is not None:
            raise self.fail(diagnosis.decode())
        missing = [call.group[i] for i, k in enumerate(keys) if not self.store.check([k])]
        arrived = [r for r in call.group if r not in missing]
        verbs = ("waits", "was") if len(arrived) == 1 else ("wait", "were")
        waiting = f"{_ranks(arrived)} {verbs[0]} in {call.describe()} ({call.where()})"
        statuses = {r: self.status_of(r) for r in missing}
        for r, st in statuses.items():
            state, detail = st["state"], st["detail"]
            if state == "exited":
                last = Call.loads(st["last"]).describe() if st["last"] else "none"
                raise self.fail(f"tpusim: rank {r} finished the script without calling {call.describe()} "
                                f"({call.where()}), which {_ranks(arrived)} called; rank {r}'s last collective: "
                                f"{last}")
            if state == "crashed":
                raise self.fail(f"tpusim: rank {r} crashed ({detail}); {waiting} and {verbs[1]} stopped")
            if state == "failed":
                raise self.fail(detail)
        blocked_elsewhere = []
        for r, st in statuses.items():
            if st["state"] != "blocked":
                stuck_since.pop(r, None)
                continue
            seen = stuck_since.get(r)
            if seen is None or seen[0] != st["detail"]:
                stuck_since[r] = (st["detail"], now)
            elif now - seen[1] >= self.grace_s:
                other = Call.loads(st["detail"])
                if self._waits_on(other, arrived):
                    blocked_elsewhere.append((r, other))
        if blocked_elsewhere and len(blocked_elsewhere) == len(missing):
            p2p = [(r, c) for r, c in blocked_elsewhere if c.p2p]
            if p2p:
                raise self.fail(unmatched_message(call, p2p[0][1]))
            others = "; ".join(f"rank {r} waits in {c.describe()} ({c.where()})" for r, c in blocked_elsewhere)
            raise self.fail(f"tpusim: deadlock: {waiting}, but {others}")
        if now - began > self.timeout_s:
            info = []
            for r in missing:
                last = self.status_of(r)["last"]
                info.append(f"rank {r} (last collective: {Call.loads(last).describe() if last else 'none'})")
            raise self.fail(f"tpusim: {', '.join(info)} did not reach {call.describe()} ({call.where()}) within "
                            f"{self.timeout_s:.0f} s while {_ranks(arrived)} waited (TPUSIM_HANG_TIMEOUT_S "
                            f"sets the limit)")
        computing = [r for r, st in statuses.items() if st["state"] == "running"]
        if not noted and computing and now - began > min(NOTE_AFTER_S, self.timeout_s / 4):
            print(f"tpusim: {waiting} for {_ranks(computing)}, still computing after {now - began:.0f} s "
                  f"(not a deadlock; the wait stops after TPUSIM_HANG_TIMEOUT_S={self.timeout_s:.0f} s)",
                  file=sys.stderr, flush=True)
            return True
        return noted
