"""Collectives on the ICI torus (and DCN): algorithms, a chooser, DES time beside the closed form.

Kinds: ``KINDS``. Sizes (``nbytes`` = V, the scaling book's "full array" per rank):
all_gather = OUTPUT bytes per rank; reduce_scatter = INPUT bytes per rank; all_reduce = the
buffer; all_to_all = the per-rank buffer B (the scaling book's V is N*B); broadcast / reduce =
the buffer; permute = the bytes each rank sends.

Who: ``axes`` = torus axis names ("x", "y", "z", and "dcn" across slices) or None for the whole
slice (every slice); or ``group`` = explicit global ranks. A group that is a full product of
axis lines (``group_axes``) is priced on those axes; a product of axis *segments*
(``group_shape``: pairs of neighbours, half an axis, every other chip) on those segments (lines,
or rings of ``stride``-hop edges, see groups.py); any other group is a ring over its ranks in
the order given. ``spmd=True`` (what the engine passes for a trace recorded on one rank) says the
group's translates, the other groups of its mesh dim, run the same collective at the same time:
for strided segments they share its links and are simulated beside it.

Algorithms (``ALGORITHMS``; adding one = a plan function, its closed form, one entry below):
ring, bidi_ring, hierarchical, multi_axis, direct, dcn (see each module's docstring). The
chooser picks the cheapest closed form among those that apply, and says why.

**Two times per collective.** ``time_s`` comes from the discrete-event simulation on
``tpusim.network.links`` (chunks queueing on one-way channels); ``closed_form_s`` from the alpha-beta
formulas in closed_form.py. On an idle network they agree (tests: within 1%); when collectives
overlap, ``collective_process`` runs inside the caller's simpy environment and network, they
contend for channels and the DES is the truth.

**Symmetry.** When the group covers full axis lines or segments, every line along an axis is a
translate of the others: the DES simulates the one through the group's first rank (``simulated``
says so) and counts the rest only in ``link_bytes``. Two collectives that use the same lines meet
on the same representative channels; collectives on disjoint axes do not.

**Fast-forward** (fastforward.py). A collective that starts on an idle network and was already
simulated alone (same request, algorithm and chunk size) is not simulated again: it ends after
the remembered time, unless another flow starts before that, which turns it back into a full
simulation from its start. ``simulated`` says which happened.

**Faults** (``Slice.faults``: failed links and chips, ``tpusim.slice.faults``). Failures break the
symmetry the representative line relies on, so on a faulted slice:

- every route and every line edge goes around the failures (``Slice.route``: the dimension-order
  route where it meets no failure, else a shortest detour), and a group containing a failed chip
  cannot run its collective (a ``FaultError`` naming the collective and the chip);
- a plan is built on *every* line its stages stand for, and ``plan.merge_translates`` folds back
  into one representative only the streams that share no channel with any other stream of their
  phase (exact: such a stream's time depends on its shape alone). So the lines a fault touches,
  and every line whose channels a detour borrows, are simulated in full; the rest as before;
- with ``spmd`` the other groups of the mesh dim (the group shifted along the axes it does not
  span, and by whole blocks along a segment's axis: ``spmd_translates``) are played beside it,
  since one of them may be the one a fault slows; the collective ends when the slowest has;
- there is no hand-written closed form: ``closed_form_s`` is ``plan.estimate`` of the rerouted
  plan, and the chooser compares those;
- the request (and so every cache key and the fast-forward memo) holds the faulted slice, so a
  healthy result is never reused for a faulted network. ``simulate_collective`` also prices the
  same collective on ``slice.healthy`` and reports the slowdown (``healthy_s``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import simpy

from tpusim.errors import TpusimError
from tpusim.network.collectives import dcn, direct, fastforward, rings, torus
from tpusim.network.collectives.groups import (
    KINDS,
    Request,
    check_members,
    interleaved_offsets,
    resolve,
    spmd_translates,
    translate,
)
from tpusim.network.collectives.groups import group_axes as _group_axes
from tpusim.network.collectives.groups import group_shape as _group_shape
from tpusim.network.collectives.plan import (
    CollectiveCost,
    CollectivePlan,
    Phase,
    PlanRun,
    Tuning,
    estimate,
    merge_translates,
    tune,
)
from tpusim.network.links import DCN_AXIS, DEFAULT_CHUNK_BYTES, Network
from tpusim.slice.topology import FaultError, Slice

__all__ = ["ALGORITHMS", "KINDS", "Algorithm", "CollectiveResult", "choose_algorithm", "closed_form_time",
           "collective_process", "group_axes", "group_shape", "simulate_collective"]


@dataclass(frozen=True)
class Algorithm:
    """One registered algorithm: how to play it (plan), its closed form, and when it applies."""

    name: str
    summary: str
    plan: Callable[[Request], CollectivePlan]
    cost: Callable[[Request], CollectiveCost | None]      # None: price the plan with plan.estimate
    supports: Callable[[Request], str | None]   # None when it applies, else why not


ALGORITHMS: dict[str, Algorithm] = {
    "ring": Algorithm("ring", "unidirectional ring (folded ring on an axis without wraparound)",
                      rings.ring_plan, rings.ring_cost, rings.supports),
    "bidi_ring": Algorithm("bidi_ring", "bidirectional ring: both directions of every link at once",
                           rings.bidi_plan, rings.bidi_cost, rings.supports),
    "hierarchical": Algorithm("hierarchical", "dimension-ordered: reduce-scatter axis by axis, then "
                              "all-gather in reverse", torus.hierarchical_plan, torus.hierarchical_cost,
                              torus.supports_hierarchical),
    "multi_axis": Algorithm("multi_axis", "data split over k axes in rotated orders so all axes "
                            "work at once (V/(k W2))", torus.multi_axis_plan, torus.multi_axis_cost,
                            torus.supports_multi_axis),
    "direct": Algorithm("direct", "one-shot: every flow at once; for small, latency-bound messages",
                        direct.plan, direct.cost, direct.supports),
    "dcn": Algorithm("dcn", "multislice: ICI stages in each slice around one DCN stage",
                     lambda req: dcn.plan(req, _best_ici_plan), lambda req: dcn.cost(req, _best_ici_cost),
                     dcn.supports),
}


@dataclass(frozen=True)
class CollectiveResult:
    """What one collective cost: DES time beside the closed form, and why this algorithm."""

    kind: str
    bytes: float
    group_size: int
    axes: tuple[str, ...]           # axes the group spans; () for an irregular group
    algorithm: str
    reason: str                     # why this algorithm was chosen
    time_s: float                   # discrete-event simulation
    closed_form_s: float            # alpha-beta formula on an idle network
    max_link_utilisation: float     # busiest channel's busy share of this collective's time (own bytes)
    link_bytes: float               # bytes x hops over all links, every translate included
    simulated: str = ""             # what the DES ran (representative lines, batching, chunk size)
    chunk_bytes: float = DEFAULT_CHUNK_BYTES
    faults: str = ""                # what failed, on a faulted slice (``tpusim.slice.faults.describe``)
    healthy_s: float | None = None  # the same collective alone on the healthy slice (simulate_collective)
    latency_s: float = 0.0          # the closed form's latency term: start-up overhead + hops x hop latency
                                    # (alpha; the rest of closed_form_s is bytes / bandwidth)

    @property
    def contention_s(self) -> float:
        """DES minus closed form: queueing behind other traffic (about 0 on an idle network)."""
        return self.time_s - self.closed_form_s

    @property
    def algbw_bytes_per_s(self) -> float:
        return self.bytes / self.time_s if self.time_s > 0 else 0.0

    @property
    def busbw_bytes_per_s(self) -> float:
        """NCCL-style bus bandwidth: algbw x 2(n-1)/n (all-reduce), (n-1)/n (gather, scatter,
        all-to-all), 1 (broadcast, reduce, permute): comparable with a link's bandwidth."""
        n = self.group_size
        factor = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n,
                  "all_to_all": (n - 1) / n}.get(self.kind, 1.0)
        return self.algbw_bytes_per_s * factor

    def to_dict(self) -> dict:
        out = {"collective": self.kind, "bytes": self.bytes, "group_size": self.group_size,
               "axes": list(self.axes), "algorithm": self.algorithm, "reason": self.reason,
               "time_s": self.time_s, "closed_form_s": self.closed_form_s,
               "contention_s": self.contention_s,
               "max_link_utilisation": self.max_link_utilisation, "link_bytes": self.link_bytes,
               "algbw_bytes_per_s": self.algbw_bytes_per_s, "busbw_bytes_per_s": self.busbw_bytes_per_s,
               "simulated": self.simulated, "chunk_bytes": self.chunk_bytes}
        if self.faults:
            out["faults"] = self.faults
        if self.healthy_s is not None:
            out["healthy_time_s"] = self.healthy_s
            out["slowdown"] = self.slowdown
        return out

    @property
    def slowdown(self) -> float | None:
        """DES time on the faulted slice over the healthy slice's (None when not compared)."""
        return self.time_s / self.healthy_s if self.healthy_s else None


# ---- plans and prices (cached: the engine prices the same collective every step) ---------------

def _algorithm(name: str) -> Algorithm:
    alg = ALGORITHMS.get(name)
    if alg is None:
        raise TpusimError(f"unknown algorithm {name!r}: accepted {', '.join(ALGORITHMS)}")
    return alg


@lru_cache(maxsize=512)
def build_plan(req: Request, name: str) -> CollectivePlan:
    """The DES plan of ``name`` for ``req`` (no start-up overhead), with the streams of SPMD
    translates that share its channels (``req.spmd``, strided segments) played beside it."""
    alg = _algorithm(name)
    if req.slice.faults:
        return _faulted_plan(req, alg, _routed(alg, req))
    plan = alg.plan(req)
    if not req.spmd:
        return plan
    own = set(plan.channel_bytes())
    phases = [list(p.streams) for p in plan.phases]
    shared = 0
    for axis in req.ici_axes:
        for delta in interleaved_offsets(req, axis):
            other = alg.plan(translate(req, axis, delta))
            for i, p in enumerate(other.phases[:len(phases)]):
                for s in p.streams:
                    if any(k in own for st in s.steps for t in st.transfers for k in t.path):
                        phases[i].append(dataclasses.replace(s, own=False))
            shared += 1
    note = (f"{plan.note}; " if plan.note else "") + (
        f"with the {shared} SPMD translate(s) interleaved on its links (groups of the same mesh dim)")
    return CollectivePlan(tuple(Phase(tuple(p)) for p in phases), note, plan.overhead_s)


def _routed(alg: Algorithm, req: Request) -> CollectivePlan:
    """``alg.plan(req)`` on a faulted slice, a route the failures cut named with its collective."""
    try:
        return alg.plan(req)
    except FaultError as error:
        raise FaultError(f"{req.kind} over {req.group_size} ranks cannot complete: {error}") from None


def _faulted_plan(req: Request, alg: Algorithm, plan: CollectivePlan) -> CollectivePlan:
    """On a faulted slice: the plan built line by line (with the SPMD translates' streams beside it
    when ``req.spmd``), folded by ``merge_translates`` (module docstring, "Faults")."""
    phases = [list(p.streams) for p in plan.phases]
    others = spmd_translates(req) if req.spmd else []
    for other in others:
        for i, p in enumerate(_routed(alg, check_members(other, req)).phases[:len(phases)]):
            phases[i].extend(dataclasses.replace(s, own=False) for s in p.streams)
    built = sum(len(p) for p in phases)
    merged = merge_translates(CollectivePlan(tuple(Phase(tuple(p)) for p in phases), plan.note, plan.overhead_s),
                              req.slice)
    kept = sum(len(p.streams) for p in merged.phases)
    note = (f"faulted slice: {kept} of {built} streams simulated (in full where a fault or a detour "
            f"touches them, once per shape elsewhere)")
    if others:
        note += f", with the {len(others)} other group(s) of its mesh dim"
    return CollectivePlan(merged.phases, (f"{plan.note}; " if plan.note else "") + note, plan.overhead_s)


@lru_cache(maxsize=1024)
def algorithm_cost(req: Request, name: str) -> CollectiveCost:
    """Closed form of ``name`` for ``req`` without the start-up overhead (on a faulted slice: the
    rerouted plan's ``estimate``)."""
    cost = None if req.slice.faults else _algorithm(name).cost(req)
    if cost is None:
        chip = req.slice.chip
        ici, dcn_bw = chip.ici_link_bytes_per_s, chip.dcn_bytes_per_s
        lat = chip.ici_hop_latency_ns * 1e-9
        dcn_lat = chip.dcn_latency_ns * 1e-9

        def bandwidth(key):
            return dcn_bw if key[2] == DCN_AXIS else ici

        def latency(key):
            if key[2] == DCN_AXIS:
                return dcn_lat if key[3] > 0 else 0.0
            return lat

        cost = estimate(build_plan(req, name), bandwidth, latency)
    return cost


def _overhead_s(req: Request) -> float:
    return req.slice.chip.collective_overhead_ns * 1e-9


def _candidates(req: Request, names: Sequence[str]) -> list[str]:
    return [n for n in names if ALGORITHMS[n].supports(req) is None]


def best_ici_algorithm(req: Request) -> str:
    """Cheapest algorithm (closed form) for a request inside one slice (used by ``dcn``)."""
    names = [n for n in _candidates(req, [n for n in ALGORITHMS if n != "dcn"]) if _worth_pricing(req, n)]
    return min(names, key=lambda n: algorithm_cost(req, n).total_s)


CHOOSER_SNAKE_MAX_RANKS = 1024


def _best_ici_plan(req: Request) -> tuple[str, CollectivePlan]:
    name = best_ici_algorithm(req)
    return name, build_plan(req, name)


def _best_ici_cost(req: Request) -> CollectiveCost:
    return algorithm_cost(req, best_ici_algorithm(req))


def _worth_pricing(req: Request, name: str) -> bool:
    """The chooser skips rings snaking over more than ``CHOOSER_SNAKE_MAX_RANKS`` ranks of several
    axes: their N/2 steps of latency alone exceed what hierarchical/multi_axis cost (same or
    better bandwidth term), and pricing them is O(N). Asked for by name, they still run."""
    if name in ("ring", "bidi_ring") and req.ranks is None and len(req.axes) > 1:
        return req.group_size <= CHOOSER_SNAKE_MAX_RANKS
    return True


@lru_cache(maxsize=512)
def _choose(req: Request) -> tuple[str, str]:
    names = [n for n in _candidates(req, list(ALGORITHMS)) if _worth_pricing(req, n)]
    if not names:
        raise TpusimError(f"no algorithm applies to {req.kind} on this group")
    costs = {n: algorithm_cost(req, n) for n in names}
    best = min(names, key=lambda n: costs[n].total_s)
    c = costs[best]
    moving = c.transfer_s / c.total_s if c.total_s > 0 else 0.0
    regime = (f"bandwidth-bound: {moving:.0%} of it moves bytes" if moving >= 0.5
              else f"latency-bound: {1 - moving:.0%} of it is per-hop latency")
    if len(names) == 1:
        return best, f"the only algorithm for {req.kind} on this group ({regime})"
    o = _overhead_s(req)
    others = ", ".join(f"{n} {_fmt_s(costs[n].total_s + o)}" for n in names)
    return best, f"cheapest closed form of {others} ({regime})"


def _fmt_s(seconds: float) -> str:
    from tpusim.units import format_seconds

    return format_seconds(seconds).replace(" ", "")


def _pick(req: Request, algorithm: str | None) -> tuple[str, str]:
    if algorithm is None:
        return _choose(req)
    alg = _algorithm(algorithm)
    why = alg.supports(req)
    if why is not None:
        ok = _candidates(req, list(ALGORITHMS))
        raise TpusimError(f"algorithm {algorithm!r} does not apply to {req.kind} on this group ({why}); "
                          f"accepted here: {', '.join(ok) or 'none'}")
    return algorithm, "requested"


# ---- public API -------------------------------------------------------------------------------

def group_axes(slice: Slice, group: Sequence[int]) -> tuple[int, ...] | None:
    """Torus axes a rank group spans when it is a full product of axis lines (DCN = ``slice.ndims``),
    e.g. all ranks varying only in x -> (0,); None for any other group (a product of segments,
    see ``group_shape``, or an irregular group, priced as a ring over its ranks in order); () for
    one rank."""
    return _group_axes(slice, group)


def group_shape(slice: Slice, group: Sequence[int]):
    """(axes, segments) of a group that is a product of axis segments, else None (groups.py):
    ``segments`` is () for full axis lines, else one ``GroupSegment`` (size, stride, start, cyclic) per
    axis, e.g. ranks {0, 1} of 3d:8x8x8 -> ((0,), (GroupSegment(x, size 2, stride 1, a line),))."""
    return _group_shape(slice, group)


def choose_algorithm(slice: Slice, kind: str, nbytes: float, axes=None, *, group=None,
                     spmd: bool = False) -> tuple[str, str]:
    """(algorithm name, why): the cheapest closed form among the algorithms that apply."""
    req = resolve(slice, kind, nbytes, axes, group, spmd)
    if req.group_size < 2:
        return "none", "a group of one rank moves nothing"
    return _choose(req)


def closed_form_time(slice: Slice, kind: str, nbytes: float, axes=None, algorithm: str | None = None, *,
                     group=None, spmd: bool = False) -> float:
    """Alpha-beta time in seconds on an idle network (start-up overhead included); root = rank 0
    (the group's first rank with ``group``)."""
    req = resolve(slice, kind, nbytes, axes, group, spmd)
    if req.group_size < 2:
        return 0.0
    name, _ = _pick(req, algorithm)
    return algorithm_cost(req, name).total_s + _overhead_s(req)


@lru_cache(maxsize=512)
def _played(req: Request, name: str, chunk_bytes: float) -> tuple[CollectivePlan, Tuning, float]:
    """(plan with start-up overhead, its tuning, closed form) of one collective on one network."""
    plan = dataclasses.replace(build_plan(req, name), overhead_s=_overhead_s(req))
    return plan, tune(plan, chunk_bytes), algorithm_cost(req, name).total_s + plan.overhead_s


def collective_process(env: simpy.Environment, network: Network, kind: str, nbytes: float, *,
                       axes=None, group=None, algorithm: str | None = None, spmd: bool = False):
    """simpy process body: one collective on ``network`` (shared with whatever else runs in ``env``);
    its return value is the ``CollectiveResult``. ``spmd``: the group's translates run it too
    (module docstring)."""
    req = resolve(network.slice, kind, nbytes, axes, group, spmd)
    labels = req.axis_labels
    if req.group_size < 2:
        yield env.timeout(0)
        return CollectiveResult(kind, req.nbytes, req.group_size, labels, "none",
                                "a group of one rank moves nothing", 0.0, 0.0, 0.0, 0.0)
    name, reason = _pick(req, algorithm)
    plan, tuning, closed = _played(req, name, network.chunk_bytes)
    key = (req, name, network.chunk_bytes)
    start = env.now
    done = env.event()
    remembered = fastforward.remembered(key) if network.idle else None
    if remembered is not None:
        held = fastforward.Held(network, plan, tuning, remembered, done.succeed)
        yield done
        how = ("fast-forward undone: another flow started before its end, simulated" if held.realized
               else "fast-forwarded: ran alone on an idle network before, not simulated again")
    else:
        alone, before = network.idle, network.flows_started
        network.wake()   # a held collective becomes a simulation before this one starts
        run = PlanRun(network, plan, tuning, done.succeed)
        run.start()
        yield done
        how = ""
        if alone and network.flows_started - before == run.flows:
            fastforward.remember(key, env.now - start)
    elapsed = env.now - start
    util = 0.0
    if elapsed > 0:
        for ck, b in plan.channel_bytes().items():
            util = max(util, b / network.channel(ck).bytes_per_s / elapsed)
    shape = f"group {req.describe_shape()}" if req.partial else ""
    notes = [x for x in (shape, plan.note, *tuning.notes, how) if x]
    return CollectiveResult(kind, req.nbytes, req.group_size, labels, name, reason, elapsed, closed,
                            min(util, 1.0), plan.link_bytes(), "; ".join(notes), tuning.chunk_bytes,
                            _describe_faults(network.slice),
                            latency_s=algorithm_cost(req, name).latency_s + plan.overhead_s)


def _describe_faults(slice_: Slice) -> str:
    if not slice_.faults:
        return ""
    from tpusim.slice.faults import describe

    return describe(slice_)


def simulate_collective(slice: Slice, kind: str, nbytes: float, *, axes=None, group=None,
                        algorithm: str | None = None, chunk_bytes: int | None = None,
                        spmd: bool = False) -> CollectiveResult:
    """One collective alone on an idle network (with its SPMD translates if ``spmd``); on a faulted
    slice also alone on the healthy one, for ``healthy_s`` and the slowdown."""
    env = simpy.Environment()
    net = Network(env, slice, chunk_bytes or DEFAULT_CHUNK_BYTES)
    proc = env.process(collective_process(env, net, kind, nbytes, axes=axes, group=group,
                                          algorithm=algorithm, spmd=spmd))
    env.run()
    result = proc.value
    if not slice.faults or result.group_size < 2:
        return result
    healthy = simulate_collective(slice.healthy, kind, nbytes, axes=axes, group=group, algorithm=algorithm,
                                  chunk_bytes=chunk_bytes, spmd=spmd)
    ratio = result.time_s / healthy.time_s if healthy.time_s > 0 else 1.0
    verdict = (f"{result.faults}; healthy slice: {_fmt_s(healthy.time_s)} by {healthy.algorithm}, so "
               f"{ratio:.2f}x the time")
    return dataclasses.replace(result, healthy_s=healthy.time_s,
                               simulated="; ".join(x for x in (result.simulated, verdict) if x))
