"""A collective as data: phases of concurrent streams of bulk-synchronous steps of transfers.

Every algorithm builds a ``CollectivePlan``; ``run_plan`` plays it on a ``Network`` (the DES) and
``estimate`` prices it without contention inside one step (the generic alpha-beta used where no
hand-written closed form exists: irregular groups, rings snaking over several axes, twisted tori).

- ``Transfer``: bytes along an explicit channel path (one or more hops, or a DCN egress/ingress).
- ``Step``: transfers that run at once; the step ends when the last one has arrived. ``repeat``
  says the same step runs that many times back to back (ring steps are all alike).
- ``TransferStream``: steps in order (one direction of one ring, one chain). ``copies`` is how many
  identical translates of it the plan stands for (symmetry): they are not simulated, but count in
  the bytes put on links. ``own`` is False for a stream of *another* group played beside this
  one because it shares channels with it (the interleaved translates of a strided group in an
  SPMD program): simulated, but not counted in this collective's bytes.
- ``Phase``: streams that run concurrently; the next phase starts when all have finished (a
  barrier: RS on x, then RS on y ...).

``merge_translates`` folds translates back together: streams that share channels form a
component; components of the same shape (the same steps over the same channels relative to
where they start) that share no channel with the rest of their phase are played once, with
their copies added: exact, since such a component's time depends on its shape alone. A
faulted slice's plans are built line by line and folded this way (groups.py, "Faults").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from tpusim.network.links import ChannelKey, Network
from tpusim.slice.topology import Slice

SEND_BUDGET = 40_000        # transfers one DES run plays; more and ring steps are batched
CHUNK_HOP_BUDGET = 400_000  # chunk-hops one DES run plays; more and the chunk size is raised


@dataclass(frozen=True)
class Transfer:
    path: tuple[ChannelKey, ...]
    nbytes: float


@dataclass(frozen=True)
class Step:
    transfers: tuple[Transfer, ...]
    repeat: int = 1


@dataclass(frozen=True)
class TransferStream:
    steps: tuple[Step, ...]
    copies: int = 1
    chunk_hint: float | None = None    # finer chunks this stream wants (one-shot flows interleave)
    own: bool = True                   # False: another group's traffic sharing these channels


@dataclass(frozen=True)
class Phase:
    streams: tuple[TransferStream, ...]


@dataclass(frozen=True)
class CollectivePlan:
    phases: tuple[Phase, ...]
    note: str = ""                          # what was simulated (symmetry), for the result
    overhead_s: float = 0.0                 # fixed start-up cost of the collective

    def link_bytes(self) -> float:
        """Bytes x hops over all links, translates included (this group's streams only)."""
        return sum(t.nbytes * len(t.path) * st.repeat * s.copies
                   for p in self.phases for s in p.streams if s.own for st in s.steps for t in st.transfers)

    def channel_bytes(self, own_only: bool = True) -> dict[ChannelKey, float]:
        """Bytes each simulated channel carries (one representative of each translate class); with
        ``own_only=False`` other groups' streams played beside it too (what the DES puts on them)."""
        out: dict[ChannelKey, float] = {}
        for p in self.phases:
            for s in p.streams:
                if own_only and not s.own:
                    continue
                for st in s.steps:
                    for t in st.transfers:
                        for k in t.path:
                            out[k] = out.get(k, 0.0) + t.nbytes * st.repeat
        return out

    def sends(self) -> int:
        return sum(len(st.transfers) * st.repeat for p in self.phases for s in p.streams for st in s.steps)


def merge_translates(plan: CollectivePlan, slice_: Slice) -> CollectivePlan:
    """``plan`` with its translates folded (module docstring). Per phase, streams that share a
    channel are joined into one component; a component whose shape (its streams' steps over
    channels relative to its first channel) repeats one seen before is folded into it: its own
    streams add their ``copies`` (bytes on links) to the kept one's, another group's streams
    (``own=False``) add nothing. Exact: a component shares no channel with the rest of its phase,
    so its time depends on its shape alone."""
    phases = []
    for phase in plan.phases:
        streams = list(phase.streams)
        parent = list(range(len(streams)))    # union-find over streams joined by a shared channel
        owner: dict[ChannelKey, int] = {}
        for i, stream in enumerate(streams):
            for k in _channels(stream):
                j = owner.setdefault(k, i)
                if j != i:
                    parent[_root(parent, i)] = _root(parent, j)
        components: dict[int, list[int]] = {}
        for i in range(len(streams)):
            components.setdefault(_root(parent, i), []).append(i)
        keep = [True] * len(streams)
        seen: dict[tuple, list[int]] = {}
        for members in components.values():
            first = next((k for i in members for k in _channels(streams[i])), None)
            if first is None:
                continue
            shape = tuple(_shape(streams[i], first, slice_) for i in members)
            kept = seen.setdefault(shape, members)
            if kept is members:
                continue
            for i, j in zip(kept, members, strict=True):
                a, b = streams[i], streams[j]
                if b.own:
                    streams[i] = replace(a, copies=a.copies + b.copies) if a.own else b
                keep[j] = False
        phases.append(Phase(tuple(st for st, k in zip(streams, keep, strict=True) if k)))
    return CollectivePlan(tuple(phases), plan.note, plan.overhead_s)


def _root(parent: list[int], i: int) -> int:
    while parent[i] != i:
        parent[i] = parent[parent[i]]
        i = parent[i]
    return i


def _channels(stream: TransferStream):
    return (k for st in stream.steps for t in st.transfers for k in t.path)


def _shape(stream: TransferStream, first: ChannelKey, slice_: Slice) -> tuple:
    """The stream relative to channel ``first``: coordinates as offsets (mod the axis length on a
    wrapped axis), so two translates of one line have the same shape."""
    s0, c0 = first[0], first[1]
    dims, wrap = slice_.dims, slice_.wrap

    def rel(key: ChannelKey) -> tuple:
        s, c, axis, d = key
        off = tuple((x - x0) % n if w else x - x0 for x, x0, n, w in zip(c, c0, dims, wrap, strict=True))
        return (s - s0, off, axis, d)

    return (stream.chunk_hint, tuple((st.repeat, tuple((t.nbytes, tuple(map(rel, t.path))) for t in st.transfers))
                                     for st in stream.steps))


@dataclass
class Tuning:
    """How a plan is played: chunk size and ring-step batching, raised to keep event counts bounded."""

    chunk_bytes: float
    batch: int = 1
    scale: float = 1.0     # every chunk (hinted ones too) is multiplied by this to bound events
    notes: list[str] = field(default_factory=list)

    def chunk_for(self, stream: TransferStream) -> float:
        base = min(self.chunk_bytes, stream.chunk_hint) if stream.chunk_hint else self.chunk_bytes
        return base * self.scale


def tune(plan: CollectivePlan, chunk_bytes: float) -> Tuning:
    """Batch repeated steps and raise chunk sizes when the plan would play too many events.

    Both are exact on an idle network: with cut-through the time of a transfer does not depend
    on its chunk size, and g batched ring steps are one send of g shards plus (g-1) step latencies.
    """
    tuning = Tuning(chunk_bytes=float(chunk_bytes))
    sends = plan.sends()
    if sends > SEND_BUDGET:
        tuning.batch = math.ceil(sends / SEND_BUDGET)
        tuning.notes.append(f"ring steps batched {tuning.batch} at a time ({sends} sends)")
    chunk_hops = 0.0
    for p in plan.phases:
        for s in p.streams:
            chunk = tuning.chunk_for(s)
            for st in s.steps:
                runs = math.ceil(st.repeat / tuning.batch)
                per = min(st.repeat, tuning.batch)
                for t in st.transfers:
                    chunk_hops += math.ceil(t.nbytes * per / chunk) * len(t.path) * runs
    if chunk_hops > CHUNK_HOP_BUDGET:
        tuning.scale = chunk_hops / CHUNK_HOP_BUDGET
        tuning.notes.append(f"chunks {tuning.scale:.3g}x larger to bound events")
    return tuning


class PlanRun:
    """Plays a plan on ``net`` as callbacks on its clock (no simpy processes); calls ``on_done()``
    at the end. Every step of every stream is a barrier over its transfers; a phase ends when all
    its streams have. The clock is looked up as ``net.env`` at each step (see network.py: a
    fast-forwarded run is replayed on a private clock, then moved onto the shared one)."""

    __slots__ = ("net", "plan", "tuning", "on_done", "flows", "_phase", "_left")

    def __init__(self, net: Network, plan: CollectivePlan, tuning: Tuning, on_done: Callable[[], None]):
        self.net, self.plan, self.tuning, self.on_done = net, plan, tuning, on_done
        self.flows = 0          # flows this run started
        self._phase = 0
        self._left = 0          # streams of the current phase still running

    def start(self) -> None:
        self.net.running += 1
        if self.plan.overhead_s > 0:
            self.net.after(self.plan.overhead_s, self._next_phase)
        else:
            self._next_phase()

    def _next_phase(self) -> None:
        phases = self.plan.phases
        while self._phase < len(phases):
            streams = phases[self._phase].streams
            self._phase += 1
            if streams:
                self._left = len(streams)
                for s in streams:
                    _StreamRun(self, s).next()
                return
        self.net.running -= 1
        self.on_done()

    def _stream_done(self) -> None:
        self._left -= 1
        if self._left == 0:
            self._next_phase()


class _StreamRun:
    """One stream's steps in order; ring steps batched ``tuning.batch`` at a time."""

    __slots__ = ("run", "stream", "chunk", "step", "left", "pending")

    def __init__(self, run: PlanRun, stream: TransferStream):
        self.run, self.stream = run, stream
        self.chunk = run.tuning.chunk_for(stream)
        self.step = -1
        self.left = 0           # repeats of the current step still to play
        self.pending = 0        # transfers of the current batch still in flight

    def next(self) -> None:
        steps = self.stream.steps
        while self.left == 0:
            self.step += 1
            if self.step == len(steps):
                self.run._stream_done()
                return
            if steps[self.step].transfers:
                self.left = steps[self.step].repeat
        st = steps[self.step]
        run = self.run
        net = run.net
        g = min(self.left, run.tuning.batch)
        self.left -= g
        self.pending = len(st.transfers)
        for t in st.transfers:
            extra = (g - 1) * net.path_latency_s(t.path) if g > 1 else 0.0
            if t.nbytes > 0 and t.path:
                run.flows += 1
            net.start_flow(t.path, t.nbytes * g, self._arrived, extra, self.chunk)

    def _arrived(self) -> None:
        self.pending -= 1
        if self.pending == 0:
            self.next()


def run_plan(net: Network, plan: CollectivePlan, tuning: Tuning):
    """simpy process body: the collective on ``net``; returns nothing (time is the clock)."""
    done = net.env.event()
    PlanRun(net, plan, tuning, done.succeed).start()
    yield done


@dataclass(frozen=True)
class CollectiveCost:
    """A closed-form time split into its latency and its byte-moving parts (seconds)."""

    latency_s: float = 0.0
    transfer_s: float = 0.0
    overhead_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.latency_s + self.transfer_s + self.overhead_s

    def __add__(self, other: CollectiveCost) -> CollectiveCost:
        return CollectiveCost(self.latency_s + other.latency_s, self.transfer_s + other.transfer_s,
                     self.overhead_s + other.overhead_s)

    def scaled(self, k: float) -> CollectiveCost:
        return CollectiveCost(self.latency_s * k, self.transfer_s * k, self.overhead_s * k)


def slowest(costs: Sequence[CollectiveCost]) -> CollectiveCost:
    return max(costs, key=lambda c: c.total_s, default=CollectiveCost())


def estimate(plan: CollectivePlan, bandwidth_of, latency_of) -> CollectiveCost:
    """Generic alpha-beta price of a plan without a hand-written formula.

    Per step: the slowest transfer's path latency plus its bytes times the most transfers that
    share one of its channels (in this step, or in the overlapping steps of the phase's other
    streams, assumed in lockstep), over the path's bandwidth. Steps add, streams of a phase
    overlap (the slowest counts), phases add. Exact when no two transfers share a channel.
    """
    total = CollectiveCost(overhead_s=plan.overhead_s)
    for phase in plan.phases:
        ranges = []
        for s in phase.streams:
            i, r = 0, []
            for st in s.steps:
                use: dict[ChannelKey, int] = {}
                for t in st.transfers:
                    for k in t.path:
                        use[k] = use.get(k, 0) + 1
                r.append((i, i + st.repeat, st, use))
                i += st.repeat
            ranges.append(r)
        costs = []
        for si, r in enumerate(ranges):
            cost = CollectiveCost()
            for lo, hi, st, use in r:
                shared = dict(use)
                for sj, r2 in enumerate(ranges):
                    if sj == si:
                        continue
                    extra: dict[ChannelKey, int] = {}
                    for lo2, hi2, _st2, use2 in r2:
                        if lo2 < hi and lo < hi2:
                            for k, v in use2.items():
                                if k in shared:
                                    extra[k] = max(extra.get(k, 0), v)
                    for k, v in extra.items():
                        shared[k] += v
                cost = cost + _step_cost(st, shared, bandwidth_of, latency_of).scaled(st.repeat)
            costs.append(cost)
        total = total + slowest(costs)
    return total


def _step_cost(st: Step, share: dict[ChannelKey, int], bandwidth_of, latency_of) -> CollectiveCost:
    best = (0.0, 0.0, 0.0)  # (total, latency, transfer) of the slowest transfer
    for t in st.transfers:
        path = t.path
        if not path:
            continue
        if len(path) == 1:
            k = path[0]
            n, lat, bw = share[k], latency_of(k), bandwidth_of(k)
        else:
            n = max(share[k] for k in path)
            lat = sum(map(latency_of, path))
            bw = min(map(bandwidth_of, path))
        x = t.nbytes * n / bw
        if lat + x > best[0]:
            best = (lat + x, lat, x)
    return CollectiveCost(best[1], best[2])
