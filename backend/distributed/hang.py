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
  it is still computing, the waiters give up after ``TPUSIM_HANG_TIMEOUT_S`` (default 300 s).

The first diagnosis is also written to the store key ``diagnosis`` so the launcher prints it once.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass

import torch.distributed as dist

POLL_S = 0.005
STATUS_EVERY_S = 0.25


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

    def signature(self) -> tuple:
        """What must agree across the group's members."""
        shapes = () if self.kind in ("all_to_all",) else self.shapes
        return self.kind, shapes, self.dtype, self.op, self.root

    def describe(self) -> str:
        shapes = ", ".join(f"{self.dtype}{list(s)}" for s in self.shapes) or "no tensor"
        extra = f", {self.op}" if self.op else ""
        root = f", root {self.root}" if self.root >= 0 else ""
        return f"{self.kind}({shapes}{extra}{root}) at {self.source or 'unknown line'}"

    def where(self) -> str:
        return f"call #{self.seq} on group {list(self.group)}, c10d group name {self.group_name!r}"

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


class Control:
    """This rank's side of the shared control store: fingerprints, status, the first diagnosis."""

    def __init__(self, store: dist.Store, rank: int) -> None:
        self.store = store
        self.rank = rank
        self.timeout_s = float(os.environ.get("TPUSIM_HANG_TIMEOUT_S", "300"))
        self.grace_s = float(os.environ.get("TPUSIM_HANG_GRACE_S", "1"))
        self.last: Call | None = None

    # -- status --------------------------------------------------------------------------------------
    def set_status(self, state: str, detail: str = "") -> None:
        self.store.set(f"status/{self.rank}", json.dumps({"state": state, "detail": detail,
                                                           "last": self.last.dumps() if self.last else ""}))

    def status_of(self, rank: int) -> dict:
        key = f"status/{rank}"
        if not self.store.check([key]):
            return {"state": "starting", "detail": "", "last": ""}
        return json.loads(self.store.get(key))

    def publish_diagnosis(self, text: str) -> None:
        self.store.compare_set("diagnosis", "", text)

    def fail(self, text: str) -> CollectiveMismatchError:
        self.publish_diagnosis(text)
        first = self.store.get("diagnosis").decode() if self.store.check(["diagnosis"]) else text
        self.set_status("failed", first)
        return CollectiveMismatchError(first)

    # -- one collective ------------------------------------------------------------------------------
    def arrive(self, call: Call, group_ranks: int) -> None:
        """Publish ``call``, wait for the other members' calls and compare; raise on any disagreement."""
        base = f"fp/{call.group_name}/{call.seq}"
        self.store.set(f"{base}/{call.rank}", call.dumps())
        self.last = call
        self.set_status("blocked", call.dumps())
        keys = [f"{base}/{r}" for r in range(group_ranks)]
        began = time.monotonic()
        next_status = began + STATUS_EVERY_S
        stuck_since: dict[int, tuple[str, float]] = {}
        sleep = POLL_S
        while not self.store.check(keys):
            now = time.monotonic()
            if now >= next_status:
                next_status = now + STATUS_EVERY_S
                self._check_missing(call, keys, stuck_since, now, began)
            time.sleep(sleep)
            sleep = min(sleep * 1.5, 0.05)
        calls = [Call.loads(v) for v in self.store.multi_get(keys)]
        if len({c.signature() for c in calls}) > 1:
            raise self.fail(mismatch_message(calls))
        self.set_status("running")

    def _waits_on(self, other: Call, blocked: list[int]) -> bool:
        """True when ``other`` needs a rank of ``blocked`` that has not arrived at it (a wait cycle)."""
        base = f"fp/{other.group_name}/{other.seq}"
        return any(r in blocked and not self.store.check([f"{base}/{i}"]) for i, r in enumerate(other.group))

    def _check_missing(self, call: Call, keys: list[str], stuck_since: dict, now: float, began: float) -> None:
        if self.store.check(["diagnosis"]):
            raise self.fail(self.store.get("diagnosis").decode())
        missing = [call.group[i] for i, k in enumerate(keys) if not self.store.check([k])]
        arrived = [r for r in call.group if r not in missing]
        waiting = f"{_ranks(arrived)} wait in {call.describe()} ({call.where()})"
        statuses = {r: self.status_of(r) for r in missing}
        for r, st in statuses.items():
            state, detail = st["state"], st["detail"]
            if state == "exited":
                last = Call.loads(st["last"]).describe() if st["last"] else "none"
                raise self.fail(f"tpusim: rank {r} finished the script without calling {call.describe()} "
                                f"({call.where()}), which {_ranks(arrived)} called; rank {r}'s last collective: "
                                f"{last}")
            if state == "crashed":
                raise self.fail(f"tpusim: rank {r} crashed ({detail}); {waiting} and were stopped")
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
