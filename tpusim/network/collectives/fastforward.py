"""Fast-forward: a collective that repeats one already simulated alone is not simulated again.

The idea of Wormhole (NSDI '26): when nothing else shares a collective's links, its completion
time is a function of the collective alone, so it can be memoised and the DES skipped.

**What is remembered.** ``ALONE[(request, algorithm, chunk size)]`` is how long the collective
took when it ran *alone*: it started on an idle network (``Network.idle``: no flow in flight,
nothing held) and, until it ended, nobody else started a flow on that network. Such a run is a
deterministic function of the key (every channel it touches is free when it starts), so the
memo is shared by every network (every ``simulate()`` call, every eager mode priced).

**When it is used.** A collective whose key is remembered and which starts on an idle network is
*held* (``Held``; ``Network.hold``) instead of simulated: nothing is scheduled but its end, at
start + the remembered time, when the channels it would have used are charged the bytes and
busy time it would have put on them (the plan's, other groups' interleaved streams included)
and it completes.

**Contention is never skipped.** If another collective starts (or anyone starts a flow) on the
network before the held collective's end, the network first calls ``Held.realize()``: the
collective is replayed from its start on a private clock up to now (it was alone all that time,
so that is exactly what happened; its events at this very instant included, as they were
scheduled before the newcomer's), its pending events move onto the shared clock, and from then
on it is simulated with the newcomer like any other collective. So a timeline with
fast-forwarding equals one without (tests and the FSDP benchmark check it), up to float rounding
and, in principle, the order of same-instant events the held collective scheduled at that very
instant.

``ENABLED = False`` turns it off (benchmarks compare both).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import simpy
from simpy.events import NORMAL, Event, EventPriority

from tpusim.network.collectives.plan import CollectivePlan, PlanRun, Tuning
from tpusim.network.links import Network

ENABLED = True
ALONE_MAX = 4096            # remembered collectives; the memo starts afresh when full
ALONE: dict[tuple, float] = {}


def remembered(key: tuple) -> float | None:
    return ALONE.get(key) if ENABLED else None


def remember(key: tuple, elapsed_s: float) -> None:
    if len(ALONE) >= ALONE_MAX:
        ALONE.clear()
    ALONE[key] = elapsed_s


def clear() -> None:
    ALONE.clear()


class Held:
    """A collective fast-forwarded on an idle network: ends at start + ``elapsed_s`` unless
    another flow starts first, which turns it into a real simulation (``realize``)."""

    def __init__(self, net: Network, plan: CollectivePlan, tuning: Tuning, elapsed_s: float,
                 on_done: Callable[[], None]):
        self.net, self.plan, self.tuning, self.on_done = net, plan, tuning, on_done
        self.start_s = net.env.now
        self.realized = False
        net.hold(self)
        net.after(elapsed_s, self._commit)

    def _commit(self) -> None:
        if self.realized:
            return
        net = self.net
        net.release(self)
        for key, nbytes in self.plan.channel_bytes(own_only=False).items():
            ch = net.channel(key)
            ch.busy_s += nbytes / ch.bytes_per_s
            ch.bytes += nbytes
            ch.mark_busy(self.start_s, self.start_s + nbytes / ch.bytes_per_s)  # trace view: span, not chunks
        self.on_done()

    def realize(self) -> None:
        """Replay the collective from its start up to now on a private clock, then move what it
        still has to do onto the network's clock (called by the network before another flow)."""
        self.realized = True
        net = self.net
        main = net.env
        now = main.now
        private = _Replay(self.start_s)
        net.env = private
        try:
            PlanRun(net, self.plan, self.tuning, self.on_done).start()
            while private.peek() <= now:   # what it did up to now, this instant included
                private.step()
        finally:
            net.env = main
        # its pending events, in the order the private clock would have processed them, scheduled on
        # the shared one: they keep their exact times and their order among themselves
        for when, priority, _order, event in sorted(e for e in private.scheduled if not e[3].processed):
            event.env = main
            main.schedule(event, priority, _delay_to(main.now, when))


class _Replay(simpy.Environment):
    """The private clock of a replay: notes every event it schedules (absolute time, priority, order),
    so that those still pending can be moved onto the shared clock through simpy's public API."""

    def __init__(self, initial_time: float):
        super().__init__(initial_time)
        self.scheduled: list[tuple[float, EventPriority, int, Event]] = []

    def schedule(self, event: Event, priority: EventPriority = NORMAL, delay: float = 0) -> None:
        self.scheduled.append((self.now + delay, priority, len(self.scheduled), event))
        super().schedule(event, priority, delay)


def _delay_to(now: float, when: float) -> float:
    """The delay ``d`` with ``now + d == when`` exactly in floating point (what ``schedule`` computes).
    ``when - now`` is one (Sterbenz: ``when <= 2 * now``, and ``now == 0``); further apart it can miss
    by an ulp, and a neighbour of it lands exactly. Where no delay does (a rounding tie, ``when`` over
    twice ``now``), ``when - now``: the time is then off by an ulp, as simpy's own ``run(until=...)``."""
    delay = when - now
    for step in (delay, math.nextafter(delay, math.inf), math.nextafter(delay, -math.inf),
                 math.nextafter(math.nextafter(delay, math.inf), math.inf),
                 math.nextafter(math.nextafter(delay, -math.inf), -math.inf)):
        if now + step == when:
            return step
    return delay
