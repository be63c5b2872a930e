"""Closed-form (alpha-beta) time of every algorithm, derived by hand beside the DES.

Notation: n ranks on the axis, W = one-way bandwidth of one link (``ici_link_bytes_per_s``),
d = per-hop latency, W2 = 2W (the scaling book's bidirectional W_ici), o = the chip's
``collective_overhead_ns`` (added once per collective). Every algorithm is bulk-synchronous
steps; a step costs ``hops * d + bytes_on_the_busiest_channel / W``, so a formula is
``o + sum over steps (latency + per-step bytes / W)``. On an idle network the DES plays the same
steps and agrees with these formulas (tests: within 1%); the scaling book's approximations are
the large-n limits, noted per formula.

Size conventions (V = ``nbytes``): all_gather: output per rank; reduce_scatter: input per rank;
all_reduce: the buffer; all_to_all: per-rank buffer B (the scaling book's V is N*B); broadcast /
reduce: the buffer; permute: what each rank sends.

**Segments** (groups.py): a group on ``n`` chips of an axis, ``stride`` apart, is a line (or a
ring, when it covers a wrapped axis) whose edges are ``stride`` hops: every formula holds with
d -> stride x d (``Axis.lat`` is one edge's latency, cut-through). With SPMD translates
interleaved on the same channels (``Axis.share`` = k groups), a step that moves b bytes over
one edge costs (``step``)

    max(stride d + b/W,  d + k b/W)

each channel carries k transfers, which reach it one hop apart, so it is busy k b/W from the
first one's start and only the last one's final hop latency shows; when the hops take longer
than the bytes, the edge's latency does. Exact for one-chunk transfers on a ring (the DES
agrees); otherwise within the chunk effects in the bandwidth-bound limit. Chains and one-shot
flows use the plain bound, W -> W/k.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tpusim.network.collectives.plan import CollectiveCost


@dataclass(frozen=True)
class Axis:
    """One axis as the formulas see it: n ranks, ring or line, link bandwidth and the latency of
    one edge (``stride`` hops on a strided segment); ``share`` groups use every channel
    (interleaved SPMD translates) and ``hop_lat`` is one hop's latency (module docstring)."""

    n: int
    cyclic: bool
    bw: float
    lat: float
    share: int = 1
    hop_lat: float | None = None

    @property
    def shared_bw(self) -> float:
        return self.bw / self.share


def step(ax: Axis, nbytes: float, edges: int = 1) -> CollectiveCost:
    """One step moving ``nbytes`` over ``edges`` edges of the axis (module docstring)."""
    lat = edges * ax.lat
    alone = CollectiveCost(lat, nbytes / ax.bw)
    if ax.share == 1:
        return alone
    hop = ax.lat if ax.hop_lat is None else ax.hop_lat
    shared = CollectiveCost(hop, ax.share * nbytes / ax.bw)
    return alone if alone.total_s >= shared.total_s else shared


def steps(ax: Axis, sizes, edges: int = 1) -> CollectiveCost:
    """Steps one after another, one per size in ``sizes``."""
    total = CollectiveCost()
    for nbytes in sizes:
        total = total + step(ax, nbytes, edges)
    return total


def ag_rs(ax: Axis, data: float, variant: str) -> CollectiveCost:
    """All-gather of ``data`` output bytes per rank (reduce-scatter: input bytes), shard s = data/n.

    - ring, uni: n-1 steps, each one shard over one hop:      (n-1)(d + s/W)   ~ V/W
    - ring, bidi: each direction reaches half the ranks: floor(n/2) steps; the bytes are
      (n-1)/2 shards per direction (for even n the opposite shard is split in halves):
                                                               floor(n/2) d + (n-1)s/(2W)  ~ V/W2
    - line, uni (folded ring, edges of <= 2 hops), n >= 3:    (n-1)(2d + s/W)  ~ V/W
    - line, bidi (pipelines up and down; the end link is busy every step):
                                                               (n-1)(d + s/W)   ~ V/W = 2V/W2
      (the scaling book: no wraparound doubles the bandwidth term; latency (n-1) hops)
    """
    n, s = ax.n, data / ax.n
    if n < 2:
        return CollectiveCost()
    if ax.cyclic and variant == "bidi":
        full = (n - 1) // 2 if n % 2 else n // 2 - 1
        return step(ax, s).scaled(full) + (step(ax, s / 2) if n % 2 == 0 else CollectiveCost())
    if ax.cyclic or variant == "bidi" or n == 2:
        return step(ax, s).scaled(n - 1)
    return step(ax, s, 2).scaled(n - 1)


def all_reduce(ax: Axis, data: float, variant: str) -> CollectiveCost:
    """Reduce-scatter then all-gather on the same ring: 2 x ``ag_rs`` (~ 2V/W2 bidi on a ring)."""
    return ag_rs(ax, data, variant).scaled(2)


def all_to_all(ax: Axis, buffer: float, variant: str) -> CollectiveCost:
    """All-to-all by forwarding bundles; piece p = B/n goes to each rank.

    - ring, uni: step t carries the n-t pieces still travelling:
          sum_{t=1}^{n-1} (d + (n-t)p/W) = (n-1)d + n(n-1)/2 p/W              ~ nB/(2W)
    - ring, bidi, even n: D = n/2 steps per direction; step t carries D-t+1/2 pieces
      (the opposite piece split): sum = D^2/2 pieces -> (n/2)d + (n^2/8) p/W = n d/2 + nB/(8W),
      which is the scaling book's V/(4 W2) with V = nB, exactly.
      odd n: D = (n-1)/2 steps, D-t+1 pieces each: D d + D(D+1)/2 p/W.
    - line, uni (folded ring): (n-1) 2d + n(n-1)/2 p/W (n >= 3).
    - line, bidi: step t's busiest link is the one at the bottom of the pipeline carrying n-t
      pieces: (n-1)d + n(n-1)/2 p/W ~ nB/(2W) (4x the wrapped ring: forwarding bundles step by
      step cannot keep the middle links busy; ``direct`` reaches the line's bisection, nB/(4W)).
    """
    n, p = ax.n, buffer / ax.n
    if n < 2:
        return CollectiveCost()
    if ax.cyclic and variant == "bidi":
        if n % 2 == 0:  # step t carries far - t - 1/2 pieces (the opposite one split): far^2/2 in all
            far = n // 2
            return steps(ax, [(far - t - 0.5) * p for t in range(far)])
        far = (n - 1) // 2
        return steps(ax, [(far - t) * p for t in range(far)])
    bundles = [(n - t) * p for t in range(1, n)]   # n(n-1)/2 pieces in all
    if ax.cyclic or variant == "bidi" or n == 2:
        return steps(ax, bundles)
    return steps(ax, bundles, 2)


def chain(ax: Axis, data: float, variant: str, root: int = 0) -> CollectiveCost:
    """Broadcast (or reduce) as pipelined chains (cut-through, so a chain of h hops costs h d + V/W).

    - ring, uni: one chain of n-1 hops:                     (n-1)d + V/W
    - ring, bidi: two chains of n-1 hops, half each:        (n-1)d + V/(2W) = (n-1)d + V/W2
    - line: chains up and down from the root, V each:       max(root, n-1-root) d + V/W
    """
    n = ax.n
    if n < 2:
        return CollectiveCost()
    bw = ax.shared_bw
    if ax.cyclic:
        return CollectiveCost((n - 1) * ax.lat, data / (2 * bw if variant == "bidi" else bw))
    return CollectiveCost(max(root, n - 1 - root) * ax.lat, data / bw)


def shift(ax: Axis, data: float) -> CollectiveCost:
    """Permute by one: ring d + V/W; line: the last rank's message goes back n-1 hops on the
    otherwise idle reverse channels: (n-1)d + V/W."""
    if ax.n < 2:
        return CollectiveCost()
    return step(ax, data, 1 if ax.cyclic else ax.n - 1)


# ---- one-shot (direct) -------------------------------------------------------------------------

def crossings(ax: Axis, root: int | None) -> tuple[int, int]:
    """(most flows crossing one channel of the axis, longest distance) for flows between positions
    routed the shortest way (ties +, as ``Slice.route``): all pairs when ``root`` is None, else the
    flows out of ``root`` (into it is the mirror image, same numbers).

    Rings: the + channel carries, for each distance d <= n/2, d of the pairs d apart:
    sum_{d=1}^{floor(n/2)} d (n=4: 1+2 = 3; n=8: 10). Lines: the middle channel is crossed by
    every pair with one end on each side: floor(n/2) ceil(n/2) (n=8: 16).
    """
    n = ax.n
    load = [[0, 0] for _ in range(n)]   # [+ channel out of i, - channel out of i]
    far = 0
    sources = range(n) if root is None else (root,)
    for i in sources:
        for j in range(n):
            if i == j:
                continue
            d = j - i
            if ax.cyclic:
                d %= n
                if 2 * d > n:
                    d -= n
            far = max(far, abs(d))
            step = 1 if d > 0 else -1
            k = i
            for _ in range(abs(d)):
                load[k][0 if step > 0 else 1] += 1
                k = (k + step) % n
    return max(max(pair) for pair in load), far


def direct(axes: list[Axis], flow_bytes: float, pattern: str, roots: list[int]) -> CollectiveCost:
    """One-shot over a product of axes with dimension-order routing (first axis first): the
    textbook alpha-beta  o + (longest route) d + (busiest channel's bytes) / W.

    pattern "pairs" (every rank to every other), "from_root" (broadcast), "to_root" (reduce).
    A flow a -> b crosses axis k's channels at the destination's coordinates on earlier axes and
    the source's on later ones, so the flows through one axis-k channel number
      pairs:      C_k x prod_{j != k} n_j       (C_k: most 1-D pairs across one channel)
      from_root:  C_k x prod_{j > k} n_j        (C_k: 1-D flows out of the root across it)
      to_root:    C_k x prod_{j < k} n_j
    It matches the DES when either term dominates (tiny messages: hops x d; huge ones: the busiest
    channel). In between the DES is lower, by up to ~10% in the tests: the flows sharing the
    busiest channel reach it after different numbers of hops, so part of their queueing hides
    behind latency; and up to ~2% higher where uneven sharing leaves a link briefly idle.
    """
    lat = 0.0
    worst = 0.0
    for k, ax in enumerate(axes):
        if ax.n < 2:
            continue
        c, far = crossings(ax, None if pattern == "pairs" else roots[k])
        if pattern == "pairs":
            mult = math.prod(a.n for j, a in enumerate(axes) if j != k)
        elif pattern == "from_root":
            mult = math.prod(a.n for a in axes[k + 1:])
        else:
            mult = math.prod(a.n for a in axes[:k])
        lat += far * ax.lat
        worst = max(worst, c * mult * flow_bytes / ax.shared_bw)
    return CollectiveCost(lat, worst)
