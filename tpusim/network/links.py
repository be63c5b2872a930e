"""ICI links and DCN of a slice on a simpy clock: flows split into chunks that queue and share links.

Model (what a number from this module means):

- **Channels.** Every physical ICI link is two one-way *channels*, each a FIFO server with the
  link's one-way bandwidth ``chip.ici_link_bytes_per_s``: what a capacity-1 simpy ``Resource``
  gives, kept as a "free at" time so a chunk costs one scheduled event per hop (see ``_Flow``;
  the profile of the Resource version was all simpy request/release bookkeeping).
  A channel is named by its key ``(slice_index, src_coord, axis, direction)``, exactly what
  ``Slice.route`` yields plus the slice index, so the two parallel links of a wrapped 2-ring stay
  apart. **DCN** is one egress and one ingress channel per chip (``axis == DCN_AXIS``, direction
  ``+1`` out, ``-1`` in), each ``chip.dcn_bytes_per_s``; a DCN transfer is egress -> ingress.
- **Latency is propagation,** not occupancy: a chunk holds a channel for ``bytes / bandwidth``;
  the per-hop latency (``ici_hop_latency_ns``; ``dcn_latency_ns`` on the egress channel) delays
  its arrival at the next chip but leaves the channel free for the next chunk.
- **Chunks and cut-through.** A message is split into chunks of ``chunk_bytes`` (default
  ``DEFAULT_CHUNK_BYTES`` = 4 MiB). A chunk is forwarded *cut-through*: it may start on the next
  hop one hop-latency after it started on this one (its head has arrived), instead of waiting
  for its tail (store-and-forward). That mirrors the fine-grained packet pipelining of real ICI
  and makes the idle-network time of an h-hop message exactly ``h * latency + bytes / bandwidth``
  whatever the chunk size, so the DES agrees with alpha-beta formulas; chunking only sets how
  finely concurrent flows interleave on a shared channel (round robin by chunk, FIFO).
- A sender queues its next chunk on the first channel only when its previous chunk is through,
  so two flows on one channel alternate chunks and each sees about half the bandwidth.
- Paths mix channels of one bandwidth only (ICI hops, or DCN egress + ingress), which is what
  makes "start one latency after the previous hop started" respect the tail of the chunk.

``link_stats`` reports per-channel busy time, bytes and utilisation (busy / elapsed).
Only channels some flow used exist (they are created lazily), which is what lets a
representative-ring simulation of an 8960-chip slice stay small.

**Faults.** On a faulted slice (``Slice.faults``) ``send`` routes around the failures
(``Slice.route``), and a path over a failed channel is refused (``FaultError``): a failed link
carries nothing, so whatever reaches the network has been rerouted first.

**Fast-forward hook.** The network counts the flows in flight (``active_flows``) and started
(``flows_started``) and the jobs running (``running``: collectives between their start and end,
counted by their runner), and can hold one *pending* fast-forwarded job (``hold``): something that
claims to know what it would do on an idle network (the collectives use it to skip a repeated
collective, see ``tpusim.network.collectives``). Whoever is about to use the network while it is pending
(``wake``: a collective starting, or any flow) makes the network call its ``realize()`` first,
so it turns into an ordinary simulation before the two can meet on a channel. Flows and the
collective runner look the clock up as ``network.env`` at every step (never a copy of it):
``realize`` replays the job on a private clock up to now and then moves its pending events onto
``env``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import simpy

from tpusim.errors import TpusimError
from tpusim.slice.topology import Coord, FaultError, Slice

DEFAULT_CHUNK_BYTES = 4 * 2**20  # fine enough to interleave ring steps of MiB shards, few events per GiB
DCN_AXIS = -1                    # axis number of the DCN egress/ingress channels in a ChannelKey
DCN_OUT, DCN_IN = 1, -1
MAX_INTERVALS = 20_000           # busy spans kept per channel for the Perfetto view (statistics are exact)
TRACED_CHANNELS = 16             # the busiest channels whose busy spans LinkStats carries

ChannelKey = tuple[int, Coord, int, int]   # (slice index, source coord, axis, direction)


@dataclass
class Channel:
    """One direction of one link (or a chip's DCN egress/ingress): a FIFO server with statistics."""

    key: ChannelKey
    bytes_per_s: float
    latency_s: float
    next_free_s: float = 0.0   # when the chunk now queued last leaves the channel (FIFO server)
    busy_s: float = 0.0
    bytes: float = 0.0
    intervals: list[list[float]] = field(default_factory=list)  # busy spans, back-to-back chunks merged

    def mark_busy(self, start: float, end: float) -> None:
        """Record a busy span for the trace view (merged with the previous one when they touch)."""
        if self.intervals and start <= self.intervals[-1][1] + 1e-12:
            self.intervals[-1][1] = max(self.intervals[-1][1], end)
        elif len(self.intervals) < MAX_INTERVALS:
            self.intervals.append([start, end])


@dataclass(frozen=True)
class ChannelStats:
    key: ChannelKey
    busy_s: float
    bytes: float
    utilisation: float
    intervals: tuple[tuple[float, float], ...] = ()   # busy spans; kept for the busiest channels only

    @property
    def name(self) -> str:
        return channel_name(self.key)


@dataclass(frozen=True)
class LinkStats:
    """Per-channel busy time, bytes and utilisation over ``elapsed_s``; busiest first."""

    elapsed_s: float
    channels: tuple[ChannelStats, ...]

    @property
    def max_utilisation(self) -> float:
        return self.channels[0].utilisation if self.channels else 0.0

    @property
    def total_bytes(self) -> float:
        return sum(c.bytes for c in self.channels)

    def to_dict(self, top: int = 10) -> dict:
        return {"elapsed_s": self.elapsed_s, "channels_used": len(self.channels),
                "max_utilisation": self.max_utilisation, "total_bytes": self.total_bytes,
                "busiest": [{"channel": c.name, "busy_s": c.busy_s, "bytes": c.bytes,
                             "utilisation": c.utilisation} for c in self.channels[:top]]}


def channel_name(key: ChannelKey) -> str:
    """(0, (1, 2, 0), 0, 1) -> 's0 (1,2,0) x+'; DCN channels read 'dcn-out'/'dcn-in'."""
    s, coord, axis, direction = key
    where = f"s{s} ({','.join(map(str, coord))})"
    if axis == DCN_AXIS:
        return f"{where} dcn-{'out' if direction == DCN_OUT else 'in'}"
    return f"{where} {'xyz'[axis] if axis < 3 else axis}{'+' if direction > 0 else '-'}"


def dcn_path(src_slice: int, src: Coord, dst_slice: int, dst: Coord) -> tuple[ChannelKey, ChannelKey]:
    """Channels of one DCN transfer: the source chip's egress, then the destination chip's ingress."""
    return ((src_slice, tuple(src), DCN_AXIS, DCN_OUT), (dst_slice, tuple(dst), DCN_AXIS, DCN_IN))


def ici_path(slice_: Slice, src: Coord, dst: Coord, slice_index: int = 0) -> tuple[ChannelKey, ...]:
    """Channels of the dimension-order route src -> dst inside one slice (around the failures of a
    faulted slice, which are in slice 0: ``Slice.route``)."""
    where = slice_ if slice_index == 0 else slice_.healthy
    return tuple((slice_index, u, axis, d) for u, _v, axis, d in where.route(tuple(src), tuple(dst)))


class Network:
    """simpy model of the ICI links (and DCN) of one ``Slice`` (times ``num_slices``)."""

    def __init__(self, env: simpy.Environment, slice: Slice, chunk_bytes: int = DEFAULT_CHUNK_BYTES):
        if chunk_bytes <= 0:
            raise TpusimError(f"chunk size {chunk_bytes!r}: expected a positive number of bytes")
        self.env = env
        self.slice = slice
        self.chunk_bytes = float(chunk_bytes)
        chip = slice.chip
        self._ici = (float(chip.ici_link_bytes_per_s), chip.ici_hop_latency_ns * 1e-9)
        self._dcn = (float(chip.dcn_bytes_per_s), chip.dcn_latency_ns * 1e-9)
        self.channels: dict[ChannelKey, Channel] = {}
        self.active_flows = 0       # flows started and not yet arrived
        self.flows_started = 0      # flows ever started (a job ran alone iff only its own started)
        self.running = 0            # jobs (collectives) started and not ended, flows or not yet
        self.pending = None         # a held fast-forwarded job (``hold``), or None

    # ---- channels ----------------------------------------------------------------------------
    def channel(self, key: ChannelKey) -> Channel:
        ch = self.channels.get(key)
        if ch is None:
            s, _coord, axis, direction = key
            if not 0 <= s < self.slice.num_slices:
                raise TpusimError(f"slice index {s} is not in 0..{self.slice.num_slices - 1}")
            if s == 0 and self.slice.faults:
                self._check_working(key)
            if axis == DCN_AXIS:
                bw, lat = self._dcn
                lat = lat if direction == DCN_OUT else 0.0
            else:
                bw, lat = self._ici
            ch = self.channels[key] = Channel(key, bw, lat)
        return ch

    def _check_working(self, key: ChannelKey) -> None:
        _s, coord, axis, direction = key
        dead = coord in self.slice.faults.chips if axis == DCN_AXIS else self.slice.channel_failed(
            coord, axis, direction)
        if dead:
            raise FaultError(f"channel {channel_name(key)} has failed: a path over it was not rerouted")

    def path_latency_s(self, path: Sequence[ChannelKey]) -> float:
        return sum(self.channel(k).latency_s for k in path)

    # ---- fast-forward ------------------------------------------------------------------------
    @property
    def idle(self) -> bool:
        """No flow in flight, no job running (one in its start-up overhead will start flows) and none
        held: every channel is free now and nobody has claimed it."""
        return self.active_flows == 0 and self.running == 0 and self.pending is None

    def hold(self, job) -> None:
        """Hold a fast-forwarded ``job`` (needs ``idle``): its ``realize()`` runs before any other flow
        starts, unless ``release(job)`` comes first."""
        assert self.idle, "a fast-forwarded job needs an idle network"
        self.pending = job

    def release(self, job) -> None:
        if self.pending is job:
            self.pending = None

    def wake(self) -> None:
        """Someone is about to use the network: a held job becomes a real simulation first."""
        if self.pending is not None:
            job, self.pending = self.pending, None
            job.realize()

    def after(self, delay: float, fn: Callable[[], None]) -> None:
        """Call ``fn()`` ``delay`` seconds from now on the network's clock."""
        self.env.timeout(delay).callbacks.append(lambda _e: fn())

    # ---- flows -------------------------------------------------------------------------------
    def send(self, src: Coord, dst: Coord, nbytes: float, *, src_slice: int = 0,
             dst_slice: int = 0) -> simpy.events.Process:
        """Move ``nbytes`` from chip ``src`` to ``dst``: dimension-order ICI route inside a slice,
        DCN (egress, ingress) between slices. The process ends when the last byte has arrived."""
        if src_slice == dst_slice:
            path: tuple[ChannelKey, ...] = ici_path(self.slice, src, dst, src_slice)
        else:
            path = dcn_path(src_slice, src, dst_slice, dst)
        return self.env.process(self._wait(self.transfer(path, nbytes)))

    def _wait(self, event: simpy.Event):
        yield event

    def transfer(self, path: Sequence[ChannelKey], nbytes: float, extra_delay_s: float = 0.0,
                 chunk_bytes: float | None = None) -> simpy.Event:
        """Move ``nbytes`` along an explicit channel path; the event fires when the last byte has
        arrived (plus ``extra_delay_s``, used for batched ring steps). An empty path is a local copy."""
        done = self.env.event()
        self.start_flow(path, nbytes, lambda: done.succeed(), extra_delay_s, chunk_bytes)
        return done

    def start_flow(self, path: Sequence[ChannelKey], nbytes: float, on_done: Callable[[], None],
                   extra_delay_s: float = 0.0, chunk_bytes: float | None = None) -> None:
        """Like ``transfer`` but calls ``on_done()`` at the end instead of firing an event (cheaper
        for the collectives, which count their transfers down)."""
        if nbytes <= 0 or not path:
            self.after(extra_delay_s, on_done)
            return
        if self.pending is not None:
            self.wake()
        chunk = self.chunk_bytes if chunk_bytes is None else float(chunk_bytes)
        count = max(1, math.ceil(nbytes / chunk - 1e-9))
        self.active_flows += 1
        self.flows_started += 1
        _Flow(self, [self.channel(k) for k in path], nbytes, chunk, count, extra_delay_s, on_done)

    # ---- statistics --------------------------------------------------------------------------
    def link_stats(self, elapsed_s: float) -> LinkStats:
        """Busy time, bytes and utilisation of every channel used so far, busiest first."""
        span = elapsed_s if elapsed_s > 0 else 1.0
        ordered = sorted(self.channels.values(), key=lambda ch: (-ch.busy_s, ch.key))
        stats = [ChannelStats(ch.key, ch.busy_s, ch.bytes, ch.busy_s / span if elapsed_s > 0 else 0.0,
                              tuple(map(tuple, ch.intervals)) if rank < TRACED_CHANNELS else ())
                 for rank, ch in enumerate(ordered)]
        return LinkStats(elapsed_s=elapsed_s, channels=tuple(stats))


class _Flow:
    """One message on a path, chunk by chunk, as callbacks on the simpy clock (no processes).

    A channel is a FIFO server: a chunk arriving at time t starts at max(t, channel free) and
    holds it for size / bandwidth; that is exactly what a capacity-1 simpy ``Resource`` requested
    in arrival order gives, at one scheduled event per chunk and hop instead of about five.
    Chunk k+1 enters the first channel when chunk k has left it; a chunk's head reaches the next
    channel one hop latency after it started on this one (cut-through); the flow is done when the
    last chunk's tail has crossed the last hop's latency.
    """

    __slots__ = ("net", "channels", "nbytes", "chunk", "count", "extra", "on_done")

    def __init__(self, net: Network, channels: list[Channel], nbytes: float, chunk: float,
                 count: int, extra: float, on_done: Callable[[], None]):
        self.net, self.channels, self.nbytes, self.chunk = net, channels, nbytes, chunk
        self.count, self.extra, self.on_done = count, extra, on_done
        self._arrive(0, 0)

    def _size(self, k: int) -> float:
        return self.chunk if k + 1 < self.count else self.nbytes - self.chunk * (self.count - 1)

    def _arrive(self, k: int, hop: int) -> None:
        env = self.net.env
        now = env.now
        ch = self.channels[hop]
        size = self._size(k)
        start = now if ch.next_free_s < now else ch.next_free_s
        hold = size / ch.bytes_per_s
        end = start + hold
        ch.next_free_s = end
        ch.busy_s += hold
        ch.bytes += size
        ch.mark_busy(start, end)
        if hop + 1 < len(self.channels):
            env.timeout(start + ch.latency_s - now).callbacks.append(
                lambda _e, k=k, h=hop + 1: self._arrive(k, h))
        elif k + 1 == self.count:
            env.timeout(end + ch.latency_s + self.extra - now).callbacks.append(self._done)
        if hop == 0 and k + 1 < self.count:
            env.timeout(end - now).callbacks.append(lambda _e, k=k + 1: self._arrive(k, 0))

    def _done(self, _event) -> None:
        self.net.active_flows -= 1
        self.on_done()
