"""Replay a program trace on a slice as a discrete-event simulation: host, device queue, units, ICI.

``simulate(plan, slice)`` runs a ``ModePlan`` (``tpusim.pricing.plan``: what an eager mode made of a trace,
``tpusim.pricing.planning.plan``; the engine never calls back into the mode) in one simpy environment
holding:

- a **host** process per simulated chip that walks its planned stream in order: it pays the
  plan's issue time per record (``chip.host_dispatch_ns`` per op as recorded) on the
  host timeline and puts the work into a bounded **device queue**; when the queue is full
  the host stalls ("queue_full"). A ``sync`` host record stalls the host until the device
  has drained everything issued so far (``reason == "synchronize"`` also waits for
  in-flight async collectives, as ``torch.tpu.synchronize()`` does); ``h2d``/``d2h`` sync
  the same way and then copy over PCIe (PyTorch's blocking ``copy_``). Memory records are
  applied at host time, which is what a caching allocator sees.
- **PCIe**, one channel each way per chip (``chip.pcie_bytes_per_s``). A ``non_blocking`` copy never stalls
  the host: it takes its place in the device queue (after the work that produced its source) and runs on its
  channel while the device goes on, as on a copy stream; an op that reads an ``h2d``'s buffer waits for it
  (a ``wait`` bound ``pcie``), an ``h2d`` of a host buffer waits for the ``d2h`` that filled it, and the
  device buffer an offload's ``d2h`` reads is freed in HBM once the copy is done (activation offload:
  tpusim/backend/offload.py). ``torch.tpu.synchronize()`` and a step's end wait for copies in flight.
- a **device** process per simulated chip that takes work in order. A chip's TensorCores
  act as one in-order queue: on v4/v5p XLA runs each kernel across both TensorCores as a
  megacore, so the compute model already prices a kernel at the whole chip's rate.
  SparseCore work (on chips that have SparseCores) runs beside the TensorCore on its own
  in-order unit; SparseCore work on chips without them falls back onto the TensorCore.
- the **ICI network** (``tpusim.network.links.Network``) in the same environment, with every
  collective a ``collective_process`` in it, so concurrent collectives contend for links.
  A synchronous collective blocks the device queue until it ends; an ``async_op``
  collective starts at its queue position and runs beside later work until an op reads or
  writes one of its tensors (by storage id, so views count), which then waits for it.

**SPMD by symmetry.** A trace recorded on one rank (every record has the same ``rank``)
is the program every rank runs: the engine simulates that one chip's host and device,
and prices each collective on the whole torus (all ranks arrive together), so a 512- or
8960-chip slice costs no more than one chip plus the network. A trace with records of
several ranks (``--ranks all``) simulates every recorded rank; a collective then starts
when the last member of its group arrives (members not in the trace are assumed on time),
and mismatched collectives are reported with rank, seq and source line.

The plan's ``queue_depth`` bounds how far the host runs ahead and ``sync_each_op`` makes the
host wait for each op (debug). A ``dispatch`` host record with reason ``compile`` is host time spent compiling a region:
it is logged as kind ``compile`` and summed in ``Timeline.host_compile_s``.

The result, ``tpusim.pricing.timeline.Timeline``, is plain data that the report turns into JSON, HTML
and Perfetto traces; each op event carries the ``KernelCost`` it was priced at.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import simpy

from tpusim.errors import TpusimError
from tpusim.hardware.compute import KernelCost, kernel_cost, transfer_seconds
from tpusim.hardware.memory import HbmTracker
from tpusim.network.collectives import collective_process
from tpusim.network.links import Network
from tpusim.pricing.plan import ModePlan, RankStream
from tpusim.pricing.timeline import TRACKS, CollectiveRun, Event, StepTime, Timeline, union_length
from tpusim.slice.topology import Slice
from tpusim.trace.records import CollectiveRecord, HostRecord, MemoryRecord, OpRecord, Record, StepMarker


# ---- the simulation ---------------------------------------------------------------------------
@dataclass
class _Item:
    """One entry of a device queue."""

    what: str                     # op | collective | fence | transfer | step
    record: Record | None = None
    cost: KernelCost | None = None
    done: simpy.Event | None = None
    wait_collectives: bool = False
    copied: simpy.Event | None = None   # transfer: fires when the copy is done (known to the host from issue on)


@dataclass
class _Call:
    """One matched collective call in MPMD mode: who arrived, and the running collective once all have."""

    first: CollectiveRecord
    gate: simpy.Event
    arrived: set[int] = field(default_factory=set)
    proc: simpy.Process | None = None
    start_s: float = 0.0


class _Rendezvous:
    """MPMD collective matching: the n-th call on a group starts when every simulated member arrives."""

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.calls: dict[tuple[tuple[int, ...], int], _Call] = {}
        self.count: dict[tuple[int, tuple[int, ...]], int] = {}

    def arrive(self, rank: int, group: tuple[int, ...], record: CollectiveRecord) -> tuple[int, _Call]:
        n = self.count.get((rank, group), 0)
        self.count[(rank, group)] = n + 1
        call = self.calls.setdefault((group, n), _Call(first=record, gate=self.env.event()))
        first = call.first
        if (first.collective, first.bytes) != (record.collective, record.bytes):
            raise TpusimError(
                f"mismatched collectives on group {list(group)} (call {n}): rank {first.rank} "
                f"{first.collective} of {first.bytes} B at seq {first.seq} ({first.source or 'no source'}) "
                f"vs rank {rank} {record.collective} of {record.bytes} B at seq {record.seq} "
                f"({record.source or 'no source'})")
        call.arrived.add(rank)
        return n, call


class _Sim:
    def __init__(self, plan: ModePlan, slice: Slice, chunk_bytes: int | None) -> None:
        self.env = simpy.Environment()
        self.slice = slice
        self.chip = slice.chip
        self.plan = plan
        self.chunk_bytes = chunk_bytes
        self.world = plan.world_size
        if self.world > slice.total_chips:
            raise TpusimError(f"the trace was recorded with world size {self.world} but topology "
                              f"{slice.spec} has {slice.total_chips} chips: use a larger --topology")
        self.symmetric = plan.symmetric
        self.events: list[Event] = []
        self.collectives: list[CollectiveRun] = []
        self.network: Network | None = None
        self.rendezvous = _Rendezvous(self.env)
        self.runners = [_Chip(self, rank, stream) for rank, stream in plan.streams.items()]

    # ---- network ----
    def net(self) -> Network:
        """The slice's ICI network, built on the first collective (compute-only runs skip it)."""
        if self.network is None:
            kwargs = {} if self.chunk_bytes is None else {"chunk_bytes": self.chunk_bytes}
            self.network = Network(self.env, self.slice, **kwargs)
        return self.network

    def group_of(self, record: CollectiveRecord) -> tuple[int, ...]:
        group = tuple(record.group) if record.group else tuple(range(self.world))
        bad = [r for r in group if not 0 <= r < self.world]
        if bad or len(set(group)) != len(group):
            raise TpusimError(f"collective {record.collective} at seq {record.seq} "
                              f"({record.source or 'no source'}): group {list(group)} must be distinct "
                              f"ranks in 0..{self.world - 1}")
        return group

    def collective(self, record: CollectiveRecord, group: tuple[int, ...]):
        """simpy process body: price one collective on the shared network; returns its CollectiveResult.

        The trace records this rank's input buffer; the collectives API takes V (all_gather: the
        output, so bytes x group size). A barrier is priced as NCCL runs it, a one-element (4 B)
        all-reduce; an empty collective as a 1-byte one (latency only).
        """
        n = len(group)
        kind = "all_reduce" if record.collective == "barrier" else record.collective
        nbytes = record.bytes * n if kind == "all_gather" else record.bytes
        if record.collective == "barrier":
            nbytes = 4
        whole = n == self.slice.total_chips and group == tuple(range(n))
        # SPMD: the group stands for every group of its mesh dim, all running this collective
        # (strided groups share links with theirs); MPMD ranks each bring their own group.
        result = yield self.env.process(collective_process(
            self.env, self.net(), kind, max(nbytes, 1), group=None if whole else group,
            spmd=self.symmetric))
        return result

    def run(self) -> Timeline:
        for chip in self.runners:
            self.env.process(chip.host())
            self.env.process(chip.device())
        self.env.run()
        for (group, n), call in self.rendezvous.calls.items():
            if call.proc is None:
                first = call.first
                missing = sorted(set(group) & {c.rank for c in self.runners} - call.arrived)
                raise TpusimError(f"collective {first.collective} (call {n} on group {list(group)}, rank "
                                  f"{first.rank} seq {first.seq}, {first.source or 'no source'}) never "
                                  f"started: rank(s) {missing} never reached it (the program would hang)")
        return self.timeline()

    def timeline(self) -> Timeline:
        total = self.env.now
        events = tuple(sorted(self.events, key=lambda e: (e.start_s, e.chip, TRACKS.index(e.track)
                                                          if e.track in TRACKS else 99, e.seq)))
        spans: dict[tuple[str, int], list[tuple[float, float]]] = {}
        for e in events:
            if e.kind not in ("wait", "stall"):
                spans.setdefault((e.track, e.chip), []).append((e.start_s, e.end_s))
        busy: dict[str, float] = {}
        for (track, _chip), intervals in sorted(spans.items()):
            busy[track] = busy.get(track, 0.0) + union_length(sorted(intervals)) / len(self.runners)
        by_bound: dict[str, float] = {}
        for e in events:
            if e.kind == "op":
                by_bound[e.bound] = by_bound.get(e.bound, 0.0) + e.seconds

        def host_sum(kind: str) -> float:
            return sum(e.seconds for e in events if e.track == "host" and e.kind == kind)

        rep = self.runners[0]
        marks = sorted(rep.step_ends)
        steps, prev = [], 0.0
        for step, end in marks:
            steps.append(StepTime(step=step, start_s=prev, end_s=end))
            prev = end
        link_stats = self.network.link_stats(total) if self.network is not None else None
        return Timeline(
            events=events, total_s=total, steps=tuple(steps), busy_s=busy, time_by_bound=by_bound,
            host_dispatch_s=host_sum("dispatch") + host_sum("host"), host_stall_s=host_sum("stall"),
            host_transfer_s=host_sum("transfer"),
            collectives=tuple(sorted(self.collectives, key=lambda c: (c.start_s, c.chip, c.seq))),
            memory={c.rank: c.hbm.result() for c in self.runners}, link_stats=link_stats,
            chips_simulated=tuple(c.rank for c in self.runners), world_size=self.world,
            symmetric=self.symmetric, policy=self.plan.mode,
            kernels=sum(1 for e in events if e.kind == "op"), meta=dict(rep.meta),
            host_compile_s=host_sum("compile"))


class _Chip:
    """Host + device of one simulated chip."""

    def __init__(self, sim: _Sim, rank: int, stream: RankStream) -> None:
        self.sim = sim
        self.env = sim.env
        self.rank = rank
        self.stream = stream
        self.meta = sim.plan.meta
        self.queue = simpy.Store(self.env, capacity=max(1, sim.plan.queue_depth))
        self.sparsecore = simpy.Resource(self.env, capacity=1)
        self.hbm = HbmTracker(sim.chip.hbm_bytes)
        self.pending: dict[int, simpy.Event] = {}       # storage id -> completion of async work on it
        self.async_compute: set[simpy.Event] = set()     # in-flight SparseCore work
        self.async_collectives: set[simpy.Event] = set()  # in-flight async collectives
        self.pcie = {"h2d": simpy.Resource(self.env, capacity=1), "d2h": simpy.Resource(self.env, capacity=1)}
        self.transfers: set[simpy.Event] = set()          # in-flight non_blocking copies
        self.host_filled: dict[int, simpy.Event] = {}      # host buffer -> the d2h that fills it
        self.offloading: dict[int, simpy.Event] = {}       # device storage -> the d2h that reads it
        self.step_ends: list[tuple[int, float]] = []

    def log(self, start: float, track: str, name: str, kind: str, record: Record | None = None,
            **extra: Any) -> None:
        if self.env.now <= start and kind in ("stall", "wait"):
            return
        self.sim.events.append(Event(start_s=start, end_s=self.env.now, track=track, chip=self.rank,
                                     name=name, kind=kind, source=getattr(record, "source", ""),
                                     seq=getattr(record, "seq", -1), **extra))

    # ---- host ----
    def host(self):
        env, chip, plan = self.env, self.sim.chip, self.sim.plan
        for rec, issue_s in zip(self.stream.records, self.stream.dispatch_s):
            if isinstance(rec, MemoryRecord):
                self._apply_memory(rec)
            elif isinstance(rec, OpRecord | CollectiveRecord):
                yield from self._dispatch(rec, issue_s)
                if isinstance(rec, OpRecord):
                    item = _Item("op", rec, cost=kernel_cost(rec, chip))
                else:
                    item = _Item("collective", rec)
                item.done = env.event() if plan.sync_each_op else None
                yield from self._put(item)
                if item.done is not None:
                    start = env.now
                    yield item.done
                    self.log(start, "host", f"wait:{_name(rec)}", "stall", rec, bound=plan.mode)
            elif isinstance(rec, HostRecord):
                if rec.event == "dispatch":
                    kind = "compile" if rec.reason == "compile" else "host"
                    yield from self._dispatch(rec, issue_s, kind=kind)
                    continue
                if rec.event in ("h2d", "d2h") and rec.non_blocking:
                    yield from self._put(_Item("transfer", rec, copied=self._issue_transfer(rec)))
                    continue
                start = env.now
                fence = _Item("fence", rec, done=env.event(),
                              wait_collectives=rec.event == "sync" and rec.reason == "synchronize")
                yield from self._put(fence)
                yield fence.done
                self.log(start, "host", f"sync:{rec.reason or rec.event}", "stall", rec,
                         bound=rec.reason or rec.event)
                if rec.event in ("h2d", "d2h"):
                    start = env.now
                    yield from self._transfer(rec)
                    self.log(start, "host", rec.event, "transfer", rec, bytes=rec.bytes, bound=rec.reason)
            elif isinstance(rec, StepMarker):
                yield from self._put(_Item("step", rec))

    def _apply_memory(self, rec: MemoryRecord) -> None:
        """HBM at host time; a free of a buffer an offload is still copying to the host waits for the copy."""
        copying = self.offloading.get(rec.storage) if rec.event == "free" else None
        if copying is not None and not copying.triggered:
            copying.callbacks.append(lambda _event: self.hbm.apply(rec, self.env.now))
        else:
            self.hbm.apply(rec, self.env.now)

    def _transfer(self, rec: HostRecord):
        """One copy on its PCIe channel, logged on the pcie track: an h2d after the d2h that filled its host buffer, a
        d2h after async work (SparseCore, a collective, an h2d) still writing its device buffer."""
        before = (self.host_filled.get(rec.host) if rec.host else None) if rec.event == "h2d" else \
            self.pending.get(rec.storage)
        if before is not None and not before.triggered:
            yield before
        with self.pcie[rec.event].request() as turn:
            yield turn
            start = self.env.now
            yield self.env.timeout(transfer_seconds(rec, self.sim.chip))
            self.log(start, "pcie", rec.event, "transfer", rec, bytes=rec.bytes, bound=rec.reason)

    def _issue_transfer(self, rec: HostRecord) -> simpy.Event:
        """A non_blocking copy issued: from now on its readers (and a free of the buffer it reads) wait for it."""
        copied = self.env.event()
        self._track(self.transfers, copied)
        if rec.event == "h2d":
            self.pending[rec.storage] = copied
        else:
            self.offloading[rec.storage] = copied
            if rec.host:
                self.host_filled[rec.host] = copied
        return copied

    def _run_transfer(self, rec: HostRecord, copied: simpy.Event):
        """A non_blocking copy that reached the device queue: it runs on PCIe beside compute."""
        yield from self._transfer(rec)
        copied.succeed()

    def _dispatch(self, rec: Record, seconds: float, kind: str = "dispatch"):
        if seconds > 0:
            start = self.env.now
            yield self.env.timeout(seconds)
            self.log(start, "host", _name(rec), kind, rec)

    def _put(self, item: _Item):
        start = self.env.now
        yield self.queue.put(item)
        self.log(start, "host", "queue_full", "stall", item.record, bound="queue_full")

    # ---- device ----
    def device(self):
        env = self.env
        while True:
            item = yield self.queue.get()
            rec = item.record
            if item.what == "op":
                yield from self._wait_deps(rec)
                cost = item.cost
                if rec.unit == "sparsecore" and not cost.fallback:
                    done = env.process(self._sparsecore(rec, cost))
                    self._track(self.async_compute, done)
                    self._mark_pending(rec, done)
                else:
                    start = env.now
                    yield env.timeout(cost.seconds)
                    self.log(start, "tensorcore", rec.op, "op", rec, bytes=cost.bytes, flops=cost.flops,
                             bound=cost.bound, cost=cost, dtype=rec.dtype)
            elif item.what == "collective":
                yield from self._wait_deps(rec)
                group = self.sim.group_of(rec)
                run = env.process(self._collective(rec, group))
                if rec.async_op:
                    self._track(self.async_collectives, run)
                    self._mark_pending(rec, run)
                else:
                    start = env.now
                    yield run
                    self.log(start, "tensorcore", f"wait:{rec.collective}", "wait", rec, bound="collective")
            elif item.what == "transfer":
                env.process(self._run_transfer(rec, item.copied))
            elif item.what == "fence":
                waits = list(self.async_compute)
                if item.wait_collectives:
                    waits += [*self.async_collectives, *self.transfers]
                if waits:
                    start, on_pcie = env.now, any(ev in self.transfers for ev in waits)
                    yield env.all_of(waits)
                    if on_pcie:
                        self.log(start, "tensorcore", "wait:pcie", "wait", rec, bound="pcie")
            elif item.what == "step":
                env.process(self._step_end(rec))
            if item.done is not None:
                item.done.succeed()

    @staticmethod
    def _track(running: set[simpy.Event], done: simpy.Event) -> None:
        """Keep ``done`` in ``running`` until it fires."""
        running.add(done)
        done.callbacks.append(running.discard)

    def _wait_deps(self, rec: OpRecord | CollectiveRecord):
        deps = []
        for t in (*rec.inputs, *rec.outputs):
            ev = self.pending.get(t.storage)
            if ev is not None:
                if ev.triggered:
                    del self.pending[t.storage]
                elif ev not in deps:
                    deps.append(ev)
        if deps:
            on_ici = any(ev in self.async_collectives for ev in deps)
            on_pcie = any(ev in self.transfers for ev in deps)
            start = self.env.now
            yield self.env.all_of(deps)
            self.log(start, "tensorcore", f"wait:{_name(rec)}", "wait", rec,
                     bound="collective" if on_ici else "pcie" if on_pcie else "sparsecore")

    def _mark_pending(self, rec: OpRecord | CollectiveRecord, done: simpy.Event) -> None:
        for t in (*rec.inputs, *rec.outputs):
            self.pending[t.storage] = done

    def _sparsecore(self, rec: OpRecord, cost: KernelCost):
        with self.sparsecore.request() as req:
            yield req
            start = self.env.now
            yield self.env.timeout(cost.seconds)
            self.log(start, "sparsecore", rec.op, "op", rec, bytes=cost.bytes, flops=cost.flops,
                     bound=cost.bound, cost=cost, dtype=rec.dtype)

    def _collective(self, rec: CollectiveRecord, group: tuple[int, ...]):
        sim, env = self.sim, self.env
        issued = env.now
        if sim.symmetric:
            result = yield env.process(sim.collective(rec, group))
            start = issued
        else:
            _, call = sim.rendezvous.arrive(self.rank, group, rec)
            if call.arrived >= set(group) & {c.rank for c in sim.runners}:
                call.start_s = env.now
                call.proc = env.process(sim.collective(rec, group))
                call.gate.succeed()
            yield call.gate
            result = yield call.proc
            start = call.start_s
        end = env.now
        self.log(start, "ici", rec.collective, "collective", rec, bytes=rec.bytes)
        sim.collectives.append(CollectiveRun(
            seq=rec.seq, chip=self.rank, kind=rec.collective, rank_bytes=rec.bytes, group_size=len(group),
            async_op=rec.async_op, issued_s=issued, start_s=start, end_s=end, source=rec.source,
            result=result))
        return result

    def _step_end(self, rec: StepMarker):
        waits = [*self.async_compute, *self.async_collectives, *self.transfers]
        if waits:
            yield self.env.all_of(waits)
        self.step_ends.append((rec.step, self.env.now))


def _name(rec: Record | None) -> str:
    if isinstance(rec, OpRecord):
        return rec.op
    if isinstance(rec, CollectiveRecord):
        return rec.collective
    if isinstance(rec, HostRecord):
        return f"{rec.event}:{rec.reason}" if rec.reason else rec.event
    return type(rec).__name__ if rec is not None else ""


def simulate(plan: ModePlan, slice: Slice, *, chunk_bytes: int | None = None) -> Timeline:
    """Run ``plan`` (an eager mode's plan of a trace: ``tpusim.pricing.planning.plan``) on ``slice``; see the
    module docstring for the model."""
    return _Sim(plan, slice, chunk_bytes).run()
