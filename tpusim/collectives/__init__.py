"""Collectives on the ICI torus (and DCN): algorithms, a chooser, DES time beside the closed form.

Kinds: ``KINDS``. Sizes (``nbytes`` = V, the scaling book's "full array" per rank):
all_gather = OUTPUT bytes per rank; reduce_scatter = INPUT bytes per rank; all_reduce = the
buffer; all_to_all = the per-rank buffer B (the scaling book's V is N*B); broadcast / reduce =
the buffer; permute = the bytes each rank sends.

Who: ``axes`` = torus axis names ("x", "y", "z", and "dcn" across slices) or None for the whole
slice (every slice); or ``group`` = explicit global ranks. A group that is a full product of
axis lines (``group_axes``) is priced on those axes; any other group is a ring over its ranks in
the order given.

Algorithms (``ALGORITHMS``; adding one = a plan function, its closed form, one entry below):
ring, bidi_ring, hierarchical, multi_axis, direct, dcn (see each module's docstring). The
chooser picks the cheapest closed form among those that apply, and says why.

**Two times per collective.** ``time_s`` comes from the discrete-event simulation on
``tpusim.network`` (chunks queueing on one-way channels); ``closed_form_s`` from the alpha-beta
formulas in closed_form.py. On an idle network they agree (tests: within 1%); when collectives
overlap, ``collective_process`` runs inside the caller's simpy environment and network, they
contend for channels and the DES is the truth.

**Symmetry.** When the group covers full axis lines, every ring along an axis is a translate
of the others: the DES simulates the one through the group's first rank (``simulated`` says so)
and counts the rest only in ``link_bytes``. Two collectives that use the same lines meet on the
same representative channels; collectives on disjoint axes do not.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import simpy

from tpusim.collectives import dcn, direct, rings, torus
from tpusim.collectives.groups import KINDS, Request, resolve
from tpusim.collectives.groups import group_axes as _group_axes
from tpusim.collectives.plan import Cost, Plan, estimate, run_plan, tune
from tpusim.errors import TpusimError
from tpusim.network import DCN_AXIS, DEFAULT_CHUNK_BYTES, Network
from tpusim.topology import Slice

__all__ = ["ALGORITHMS", "KINDS", "Algorithm", "CollectiveResult", "choose_algorithm", "closed_form_time",
           "collective_process", "group_axes", "simulate_collective"]


@dataclass(frozen=True)
class Algorithm:
    """One registered algorithm: how to play it (plan), its closed form, and when it applies."""

    name: str
    summary: str
    plan: Callable[[Request], Plan]
    cost: Callable[[Request], Cost | None]      # None: price the plan with plan.estimate
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
                     dcn.plan, dcn.cost, dcn.supports),
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
        return out


# ---- plans and prices (cached: the engine prices the same collective every step) ---------------

def _algorithm(name: str) -> Algorithm:
    alg = ALGORITHMS.get(name)
    if alg is None:
        raise TpusimError(f"unknown algorithm {name!r}: accepted {', '.join(ALGORITHMS)}")
    return alg


@lru_cache(maxsize=512)
def build_plan(req: Request, name: str) -> Plan:
    """The DES plan of ``name`` for ``req`` (no start-up overhead)."""
    return _algorithm(name).plan(req)


@lru_cache(maxsize=1024)
def algorithm_cost(req: Request, name: str) -> Cost:
    """Closed form of ``name`` for ``req`` without the start-up overhead."""
    cost = _algorithm(name).cost(req)
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
    e.g. all ranks varying only in x -> (0,); None for an irregular group (priced as a ring over
    its ranks in order); () for one rank."""
    return _group_axes(slice, group)


def choose_algorithm(slice: Slice, kind: str, nbytes: float, axes=None) -> tuple[str, str]:
    """(algorithm name, why): the cheapest closed form among the algorithms that apply."""
    req = resolve(slice, kind, nbytes, axes)
    if req.group_size < 2:
        return "none", "a group of one rank moves nothing"
    return _choose(req)


def closed_form_time(slice: Slice, kind: str, nbytes: float, axes=None, algorithm: str | None = None) -> float:
    """Alpha-beta time in seconds on an idle network (start-up overhead included); root = rank 0."""
    req = resolve(slice, kind, nbytes, axes)
    if req.group_size < 2:
        return 0.0
    name, _ = _pick(req, algorithm)
    return algorithm_cost(req, name).total_s + _overhead_s(req)


def collective_process(env: simpy.Environment, network: Network, kind: str, nbytes: float, *,
                       axes=None, group=None, algorithm: str | None = None):
    """simpy process body: one collective on ``network`` (shared with whatever else runs in ``env``);
    its return value is the ``CollectiveResult``."""
    req = resolve(network.slice, kind, nbytes, axes, group)
    labels = req.axis_labels
    if req.group_size < 2:
        yield env.timeout(0)
        return CollectiveResult(kind, req.nbytes, req.group_size, labels, "none",
                                "a group of one rank moves nothing", 0.0, 0.0, 0.0, 0.0)
    name, reason = _pick(req, algorithm)
    plan = dataclasses.replace(build_plan(req, name), overhead_s=_overhead_s(req))
    closed = algorithm_cost(req, name).total_s + plan.overhead_s
    tuning = tune(plan, network.chunk_bytes)
    start = env.now
    yield from run_plan(network, plan, tuning)
    elapsed = env.now - start
    util = 0.0
    if elapsed > 0:
        for key, b in plan.channel_bytes().items():
            util = max(util, b / network.channel(key).bytes_per_s / elapsed)
    notes = [x for x in (plan.note, *tuning.notes) if x]
    return CollectiveResult(kind, req.nbytes, req.group_size, labels, name, reason, elapsed, closed,
                            min(util, 1.0), plan.link_bytes(), "; ".join(notes), tuning.chunk_bytes)


def simulate_collective(slice: Slice, kind: str, nbytes: float, *, axes=None, group=None,
                        algorithm: str | None = None, chunk_bytes: int | None = None) -> CollectiveResult:
    """One collective alone on an idle network."""
    env = simpy.Environment()
    net = Network(env, slice, chunk_bytes or DEFAULT_CHUNK_BYTES)
    proc = env.process(collective_process(env, net, kind, nbytes, axes=axes, group=group,
                                          algorithm=algorithm))
    env.run()
    return proc.value
