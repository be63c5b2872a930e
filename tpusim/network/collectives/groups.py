"""Who takes part in a collective: axes or rank groups -> a ``Request``, and the lines and rings
(with their channel paths) that algorithms move data along.

Ranks are global: ``rank = slice_index * chips_per_slice + rank_in_slice`` (x fastest inside a
slice, as ``Slice.rank_of``). Axes are named "x", "y", "z" (the slice's torus axes) and "dcn"
(the slices of a multislice run, only when ``num_slices > 1``); as numbers, DCN is
``slice.ndims``. A node is ``(slice_index, coord)``.

**Symmetry.** When a group is a full product of axis lines (``group_axes``), every line along an
axis is a translate of every other, so algorithms build their streams on the one line through
the group's first rank (the *root*) and record how many translates it stands for.

**Sub-axis groups** (``group_shape``). A group that is a product of *segments* of axes, one per
axis it spans, gets the same treatment. A segment is ``size`` chips ``stride`` apart along one
axis from coordinate ``start`` (mod the axis length on a wrapped axis): DeviceMesh dims placed on
part of an axis give them (tp=x2: pairs of neighbours; fsdp over the other factor of x: every
other chip, stride 2). Its lines are translates of each other, so one representative line per
axis is simulated, as for full lines. How a segment closes:

- ``size * stride == n`` on a wrapped axis: a **ring** whose every edge is ``stride`` hops (the
  last edge crosses the wraparound link); the whole axis is the case stride 1.
- otherwise a **line** (no edge between its ends): the ends are linked only through chips
  outside the group, and routing that edge the long way round is never shorter for a segment
  accepted here. On a wrapped axis a segment is accepted only when its span is less than half
  the ring, ``2 (size-1) stride < n`` (so every route between its members stays inside it; the
  segments of a mesh, ``size * stride`` dividing ``n``, always are); a longer arithmetic run,
  and any group on a twisted torus or across slices that is not a full product, is irregular
  (a ring over its ranks in the order given).

**SPMD translates** (``Request.spmd``). In an SPMD program every group of a mesh dim runs the
same collective at the same time. For full lines and contiguous segments those translates use
disjoint channels and change nothing. The translates of a *strided* segment are interleaved
with it (stride 2: the groups of even and odd chips of x): they cross the same channels, so
with ``spmd`` the DES plays them beside the group (``interleaved_offsets``; streams with
``own=False``) and the closed forms count how many share each link (``closed_form.step``).

**Faults** (``Slice.faults``) break the symmetry: the lines through a failed link or chip are no
longer translates of the others, and their detours borrow other lines' channels. On a faulted
slice every path is rerouted (``reroute``: each edge of a line, each route between ranks, around
the failures as ``Slice.route`` does), and ``lines_for`` builds *every* line a stage stands for,
not one representative; with ``spmd`` the other groups of its mesh dim are played beside it
(``spmd_translates``). ``plan.merge_translates`` then folds back into one representative each
the lines (or sets of lines sharing channels, such as a strided group and its interleaved
translate) that share no channel with the rest of their phase, so what stays simulated in full
is exactly the lines a fault touches and the lines whose channels a detour borrows. A group that
contains a failed chip cannot run its collective (``check_members``: a ``FaultError`` naming
the chip).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from tpusim.errors import TpusimError
from tpusim.network.links import DCN_AXIS, ChannelKey, dcn_path, ici_path
from tpusim.slice.topology import Coord, FaultError, Slice, format_coord

KINDS = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast", "reduce", "permute")
DCN_NAME = "dcn"

Node = tuple[int, Coord]
Path = tuple[ChannelKey, ...]


@dataclass(frozen=True)
class GroupSegment:
    """How a group covers one torus axis: ``size`` chips ``stride`` apart from coordinate ``start``
    (mod the axis length when it wraps); ``cyclic`` when they close into a ring (module docstring)."""

    axis: int
    size: int
    stride: int
    start: int
    cyclic: bool

    def coord(self, i: int, n: int) -> int:
        """Axis coordinate of the segment's i-th chip on an axis of length ``n``."""
        return (self.start + i * self.stride) % n

    def full(self, n: int) -> bool:
        return self.size == n

    def describe(self, slice_: Slice) -> str:
        n = slice_.dims[self.axis]
        name = slice_.axis_names[self.axis]
        if self.full(n):
            return f"{name} (all {n}, {'ring' if self.cyclic else 'line'})"
        how = "ring" if self.cyclic else "line"
        step = f", {self.stride} hops an edge" if self.stride > 1 else ""
        return f"{name} ({self.size} of {n}, stride {self.stride}: a {how}{step})"


@dataclass(frozen=True)
class Request:
    """One collective, resolved: what moves, among whom. Hashable, so plans can be cached."""

    slice: Slice
    kind: str
    nbytes: float
    axes: tuple[int, ...]               # axes the group spans (DCN = slice.ndims); () if irregular/one rank
    root: Node                          # the group's first rank: broadcast/reduce root, line anchor
    ranks: tuple[Node, ...] | None      # irregular group, in ring order; None when ``axes`` describe it
    group_size: int
    segments: tuple[GroupSegment, ...] = ()  # one per ICI axis in ``axes`` when some is not whole; () else
    spmd: bool = False                  # its SPMD translates run too (set for strided segments, and for
                                        # every product group on a faulted slice)

    @property
    def dcn_axis(self) -> int:
        return self.slice.ndims

    def segment(self, axis: int) -> GroupSegment:
        """The group's segment of an ICI axis (the whole axis unless ``segments`` says otherwise)."""
        for seg in self.segments:
            if seg.axis == axis:
                return seg
        n = self.slice.dims[axis]
        return GroupSegment(axis, n, 1, 0, bool(self.slice.wrap[axis]) and n > 1)

    def position(self, axis: int) -> int:
        """The root's index along its line of ``axis`` (its coordinate, on a whole axis)."""
        if axis == self.dcn_axis:
            return self.root[0]
        seg = self.segment(axis)
        n = self.slice.dims[axis]
        return ((self.root[1][axis] - seg.start) % n) // seg.stride

    @property
    def partial(self) -> bool:
        """Some axis is covered by a segment, not whole."""
        return bool(self.segments)

    def describe_shape(self) -> str:
        return ", ".join(self.segment(a).describe(self.slice) for a in self.ici_axes)

    @property
    def has_dcn(self) -> bool:
        return self.ranks is None and self.dcn_axis in self.axes

    @property
    def ici_axes(self) -> tuple[int, ...]:
        return tuple(a for a in self.axes if a != self.dcn_axis)

    def size(self, axis: int) -> int:
        """Ranks of the group along one line of ``axis``."""
        if axis == self.dcn_axis:
            return self.slice.num_slices
        return self.segment(axis).size if self.segments else self.slice.dims[axis]

    def axis_label(self, axis: int) -> str:
        return DCN_NAME if axis == self.dcn_axis else self.slice.axis_names[axis]

    @property
    def axis_labels(self) -> tuple[str, ...]:
        return tuple(self.axis_label(a) for a in self.axes)


def axis_choices(slice_: Slice) -> tuple[str, ...]:
    return slice_.axis_names + ((DCN_NAME,) if slice_.num_slices > 1 else ())


def parse_axes(slice_: Slice, axes: Sequence[str | int] | str) -> tuple[int, ...]:
    """Axis names (or numbers) -> axis numbers, in the order given; unknown or repeated -> error."""
    if isinstance(axes, str):
        axes = [a.strip() for a in axes.split(",") if a.strip()]
    names = axis_choices(slice_)
    out: list[int] = []
    for a in axes:
        if isinstance(a, int) and not isinstance(a, bool):
            idx = a
            if not 0 <= idx < len(names):
                raise TpusimError(f"axis {a} is not in slice {slice_.spec}: accepted 0..{len(names) - 1} "
                                  f"({', '.join(names)})")
        else:
            name = str(a).strip().lower()
            if name not in names:
                more = "" if slice_.num_slices > 1 else " ('dcn' needs slices > 1)"
                raise TpusimError(f"axis {a!r} is not an axis of slice {slice_.spec}: accepted "
                                  f"{', '.join(names)}{more}")
            idx = names.index(name)
        if idx in out:
            raise TpusimError(f"axis {names[idx]!r} is listed twice in axes {list(axes)}")
        out.append(idx)
    if not out:
        raise TpusimError(f"axes is empty: name at least one of {', '.join(names)}")
    return tuple(out)


def node_of(slice_: Slice, rank: int) -> Node:
    s, local = divmod(int(rank), slice_.num_chips)
    return s, slice_.coord_of(local)


def rank_of(slice_: Slice, node: Node) -> int:
    return node[0] * slice_.num_chips + slice_.rank_of(node[1])


def _check_group(slice_: Slice, group: Sequence[int]) -> tuple[int, ...]:
    ranks = tuple(int(r) for r in group)
    total = slice_.total_chips
    bad = [r for r in ranks if not 0 <= r < total]
    if bad:
        raise TpusimError(f"group has rank(s) {bad[:5]} outside 0..{total - 1} of slice {slice_.spec}"
                          + (f" x {slice_.num_slices} slices" if slice_.num_slices > 1 else ""))
    if len(set(ranks)) != len(ranks):
        raise TpusimError(f"group {list(ranks)[:16]} repeats a rank: a group lists distinct ranks")
    if not ranks:
        raise TpusimError("group is empty: list at least one rank")
    return ranks


def group_axes(slice_: Slice, group: Sequence[int]) -> tuple[int, ...] | None:
    """The axes a rank group spans when it is a full product of axis lines, else None.

    E.g. on 4x4x4 the ranks varying only in x ({0,1,2,3}) -> (0,); a 4x4 plane -> (0, 1); the
    whole slice -> (0, 1, 2); ranks {0, 2} (half a line) -> None. DCN is axis ``slice.ndims``.
    Axes of length 1 never appear; one rank -> ().
    """
    return _group_axes(slice_, _check_group(slice_, group))


@lru_cache(maxsize=256)
def _group_axes(slice_: Slice, ranks: tuple[int, ...]) -> tuple[int, ...] | None:
    shape = _group_shape(slice_, ranks)
    return shape[0] if shape is not None and not shape[1] else None


def group_shape(slice_: Slice, group: Sequence[int]) -> tuple[tuple[int, ...], tuple[GroupSegment, ...]] | None:
    """(axes spanned, segments) when the group is a product of axis segments (module docstring),
    else None. ``segments`` is () when every spanned axis is whole (``group_axes``'s groups), else
    one ``GroupSegment`` per spanned axis. E.g. on 3d:8x8x8, ranks {0, 1} -> ((0,), (x: 2 of 8, a line)),
    the even chips of x times y and z -> ((0, 1, 2), (x: 4, stride 2, a ring; y; z))."""
    return _group_shape(slice_, _check_group(slice_, group))


@lru_cache(maxsize=256)
def _group_shape(slice_: Slice, ranks: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[GroupSegment, ...]] | None:
    nodes = [node_of(slice_, r) for r in ranks]
    ndims = slice_.ndims
    columns = [{c[1][a] for c in nodes} for a in range(ndims)] + [{c[0] for c in nodes}]
    sizes = list(slice_.dims) + [slice_.num_slices]
    spanned = tuple(a for a in range(ndims + 1) if len(columns[a]) > 1)
    if math.prod(len(columns[a]) for a in spanned) != len(ranks):
        return None  # not a product of per-axis sets
    if all(len(columns[a]) == sizes[a] for a in spanned):
        return spanned, ()
    if ndims in spanned or slice_.twisted:
        return None  # segments only inside one slice of a plain torus (module docstring)
    segs = []
    for a in spanned:
        seg = _segment(a, sorted(columns[a]), slice_.dims[a], bool(slice_.wrap[a]))
        if seg is None:
            return None
        segs.append(seg)
    return spanned, tuple(segs)


def _segment(axis: int, pos: list[int], n: int, wrap: bool) -> GroupSegment | None:
    """The segment through sorted coordinates ``pos`` of one axis, or None (module docstring)."""
    m = len(pos)
    if m == n:
        return GroupSegment(axis, n, 1, 0, wrap)
    gaps = [b - a for a, b in zip(pos, pos[1:])]
    if not wrap:
        return GroupSegment(axis, m, gaps[0], pos[0], False) if len(set(gaps)) == 1 else None
    gaps.append(pos[0] + n - pos[-1])          # cyclic gaps; gaps[i] is pos[i] -> pos[i+1]
    if len(set(gaps)) == 1:
        return GroupSegment(axis, m, gaps[0], pos[0], True)   # m * stride == n: a ring
    big = max(gaps)
    stride = min(gaps)
    if gaps.count(big) != 1 or gaps.count(stride) != m - 1 or 2 * (m - 1) * stride >= n:
        return None
    start = pos[(gaps.index(big) + 1) % m]     # the chip after the one long gap
    return GroupSegment(axis, m, stride, start, False)


def interleaved_offsets(req: Request, axis: int) -> tuple[int, ...]:
    """Shifts along ``axis`` of the SPMD translates that share this group's channels on that axis:
    for a strided segment, the other ``stride - 1`` residues of its block (those that fit in the
    axis); () for whole axes, contiguous segments, or without ``spmd``."""
    if not req.spmd or axis == req.dcn_axis:
        return ()
    seg = req.segment(axis)
    if seg.stride == 1:
        return ()
    n = req.slice.dims[axis]
    base = seg.start - seg.start % seg.stride
    out = []
    for o in range(seg.stride):
        delta = base + o - seg.start
        if delta == 0:
            continue
        if not req.slice.wrap[axis] and not 0 <= seg.start + delta + (seg.size - 1) * seg.stride < n:
            continue
        out.append(delta)
    return tuple(out)


def translate(req: Request, axis: int, delta: int) -> Request:
    """The same collective on the group shifted by ``delta`` along ``axis`` (an SPMD translate)."""
    n = req.slice.dims[axis]
    s, c = req.root
    root = (s, c[:axis] + ((c[axis] + delta) % n,) + c[axis + 1:])
    segs = tuple(dataclasses.replace(g, start=(g.start + delta) % n) if g.axis == axis else g
                 for g in req.segments)
    return dataclasses.replace(req, root=root, segments=segs, spmd=False)


def resolve(slice_: Slice, kind: str, nbytes: float, axes=None, group=None, spmd: bool = False) -> Request:
    """Validate a collective call and describe its group (axes, segments, or an irregular rank list).

    ``spmd``: the group's translates (the other groups of its mesh dim) run the same collective at
    the same time; it matters only for strided segments (module docstring)."""
    if kind not in KINDS:
        raise TpusimError(f"unknown collective {kind!r}: accepted {', '.join(KINDS)}")
    try:
        size = float(nbytes)
    except (TypeError, ValueError):
        raise TpusimError(f"bytes {nbytes!r}: expected a positive number of bytes") from None
    if not size > 0 or math.isinf(size):
        raise TpusimError(f"bytes {nbytes!r}: a collective moves a positive, finite number of bytes")
    if axes is not None and group is not None:
        raise TpusimError("give axes or group, not both")
    if group is not None:
        ranks = _check_group(slice_, group)
        shape = _group_shape(slice_, ranks)
        root = node_of(slice_, ranks[0])
        if shape is None:
            return Request(slice_, kind, size, (), root, tuple(node_of(slice_, r) for r in ranks), len(ranks))
        spanned, segs = shape
        # translates matter when they share its links (strided) or may be slowed by a fault
        shared = spmd and (any(g.stride > 1 for g in segs) or bool(slice_.faults))
        return check_members(Request(slice_, kind, size, spanned, root, None, len(ranks), segs, shared))
    if axes is None:
        picked = tuple(range(slice_.ndims + (1 if slice_.num_slices > 1 else 0)))
    else:
        picked = parse_axes(slice_, axes)
    sizes = list(slice_.dims) + [slice_.num_slices]
    picked = tuple(a for a in picked if sizes[a] > 1)
    return check_members(Request(slice_, kind, size, picked, (0, (0,) * slice_.ndims), None,
                                 math.prod(sizes[a] for a in picked)))


def members(req: Request) -> list[Node]:
    """Every node of the group (the product of its lines through the root, or its rank list)."""
    if req.ranks is not None:
        return list(req.ranks)
    return translate_roots(req, req.axes)


def check_members(req: Request, translate_of: Request | None = None) -> Request:
    """``req`` unless its group contains a failed chip (faults are in slice 0): then a FaultError.
    ``translate_of``: ``req`` is another group of that request's mesh dim (``spmd_translates``)."""
    chips = req.slice.faults.chips
    if not chips or req.group_size < 2:
        return req
    for s, c in members(req):
        if s == 0 and c in chips:
            rank = rank_of(req.slice, (s, c))
            whose = "its group includes"
            if translate_of is not None:
                whose = (f"in this SPMD program the group of its mesh dim through rank {rank} runs it too, "
                         f"and that group includes")
            raise FaultError(f"{req.kind} over {req.group_size} ranks cannot complete: {whose} failed chip "
                             f"{format_coord(c)} (rank {rank}; --fail-chips); every rank of a collective must "
                             f"take part")
    return req


def spmd_translates(req: Request) -> list[Request]:
    """The other groups of the group's mesh dim inside its slice, as requests: the group shifted to
    every position along each ICI axis it does not span, and along an axis it covers with a segment
    by each shift whose chips are disjoint from the group's and the shifts' before it (blocks, and
    the interleaved residues of a strided segment). [] for irregular groups."""
    if req.ranks is not None:
        return []
    per_axis: list[tuple[int, list[int]]] = []
    for axis, n in enumerate(req.slice.dims):
        if n == 1:
            continue
        if axis not in req.axes:
            per_axis.append((axis, list(range(1, n))))
            continue
        seg = req.segment(axis)
        if seg.full(n):
            continue
        wrap = bool(req.slice.wrap[axis])
        covered = {seg.coord(i, n) for i in range(seg.size)}
        deltas = []
        for delta in range(1, n):
            start = (seg.start + delta) % n
            if not wrap and start + (seg.size - 1) * seg.stride >= n:
                continue
            chips = {(start + i * seg.stride) % n for i in range(seg.size)}
            if chips.isdisjoint(covered):
                deltas.append(delta)
                covered |= chips
        per_axis.append((axis, deltas))
    out = []
    for combo in itertools.product(*[[0, *deltas] for _axis, deltas in per_axis]):
        if not any(combo):
            continue
        other = req
        for (axis, _deltas), delta in zip(per_axis, combo, strict=True):
            if delta:
                other = translate(other, axis, delta)
        out.append(other)
    return out


# ---- lines and rings -------------------------------------------------------------------------

@dataclass(frozen=True)
class Line:
    """Nodes along one axis (or a logical ring over a rank list) with the channel paths between them.

    ``cyclic``: a ring (wrapped axis, DCN, or a logical ring); otherwise a line whose ends are
    not linked. ``fwd[i]`` is the path i -> i+1 and ``bwd[i]`` the path i -> i-1 (indices mod n
    when cyclic; on a line ``fwd[n-1]`` and ``bwd[0]`` are empty). ``regular``: every fwd/bwd path
    is one hop, so the hand-written closed forms apply. ``copies``: translates it stands for.
    """

    nodes: tuple[Node, ...]
    cyclic: bool
    fwd: tuple[Path, ...]
    bwd: tuple[Path, ...]
    regular: bool
    copies: int
    slice: Slice

    @property
    def n(self) -> int:
        return len(self.nodes)

    def walk(self, start: int, hops: int, direction: int) -> Path:
        """Concatenated path from position ``start`` over ``hops`` fwd (+1) or bwd (-1) steps."""
        out: list[ChannelKey] = []
        i = start
        for _ in range(hops):
            out.extend(self.fwd[i] if direction > 0 else self.bwd[i])
            i = (i + direction) % self.n
        return tuple(out)

    def path(self, i: int, j: int) -> Path:
        """Path between two positions: along the line (no wrap) for lines, routed for logical rings."""
        if i == j:
            return ()
        if not self.cyclic:
            return self.walk(i, abs(j - i), 1 if j > i else -1)
        return node_path(self.slice, self.nodes[i], self.nodes[j])


def node_path(slice_: Slice, a: Node, b: Node) -> Path:
    """ICI dimension-order route inside a slice; DCN egress -> ingress between slices."""
    if a[0] != b[0]:
        return dcn_path(a[0], a[1], b[0], b[1])
    hop = _one_hop(slice_, a[1], b[1])
    if hop is not None:
        return reroute(slice_, ((a[0], a[1], hop[0], hop[1]),))
    return ici_path(slice_, a[1], b[1], a[0])


def _one_hop(slice_: Slice, a: Coord, b: Coord) -> tuple[int, int] | None:
    """(axis, direction) when b is one hop from a along one axis (what ``route`` would take), else None:
    a fast path for rings whose edges are mostly neighbours (snakes over 8960 chips)."""
    if slice_.twisted:
        return None
    diff = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
    if len(diff) != 1:
        return None
    axis = diff[0]
    n, d = slice_.dims[axis], b[axis] - a[axis]
    if slice_.wrap[axis]:
        d %= n
        if 2 * d > n:
            d -= n
    return (axis, d) if abs(d) == 1 else None


def axis_line(slice_: Slice, axis: int, through: Node, copies: int = 1) -> Line:
    """The line (or ring, if the axis wraps) along ``axis`` through node ``through``."""
    s, c = through
    if axis == slice_.ndims:  # DCN: the same chip position in every slice, a ring over the datacenter
        nodes = tuple((k, c) for k in range(slice_.num_slices))
        n = len(nodes)
        fwd = tuple(dcn_path(k, c, (k + 1) % n, c) for k in range(n))
        bwd = tuple(dcn_path(k, c, (k - 1) % n, c) for k in range(n))
        return Line(nodes, True, fwd, bwd, True, copies, slice_)
    n = slice_.dims[axis]
    nodes = tuple((s, c[:axis] + (i,) + c[axis + 1:]) for i in range(n))
    cyclic = bool(slice_.wrap[axis]) and n > 1
    fwd, bwd = [], []
    for i in range(n):
        fwd.append(_hop(slice_, nodes, i, (i + 1) % n, axis, 1, cyclic or i + 1 < n))
        bwd.append(_hop(slice_, nodes, i, (i - 1) % n, axis, -1, cyclic or i > 0))
    if slice_.faults:
        fwd, bwd = [reroute(slice_, p) for p in fwd], [reroute(slice_, p) for p in bwd]
    regular = all(len(p) == 1 for p in fwd + bwd if p) and not slice_.twisted
    return Line(nodes, cyclic, tuple(fwd), tuple(bwd), regular, copies, slice_)


def segment_line(slice_: Slice, seg: GroupSegment, through: Node, copies: int = 1) -> Line:
    """The line (or ring, if ``seg.cyclic``) of a segment through node ``through``; each edge is
    ``seg.stride`` hops along the axis, in the direction asked (not the shortest route: a ring of
    two chips half the axis apart has distinct edges both ways)."""
    axis = seg.axis
    n = slice_.dims[axis]
    s, c = through
    m = seg.size
    nodes = tuple((s, c[:axis] + (seg.coord(i, n),) + c[axis + 1:]) for i in range(m))
    fwd = tuple(_axis_walk(nodes[i], axis, 1, seg.stride, n) if seg.cyclic or i + 1 < m else ()
                for i in range(m))
    bwd = tuple(_axis_walk(nodes[i], axis, -1, seg.stride, n) if seg.cyclic or i > 0 else ()
                for i in range(m))
    if slice_.faults:
        fwd, bwd = tuple(reroute(slice_, p) for p in fwd), tuple(reroute(slice_, p) for p in bwd)
        return Line(nodes, seg.cyclic, fwd, bwd, False, copies, slice_)
    return Line(nodes, seg.cyclic, fwd, bwd, seg.stride == 1, copies, slice_)


def _axis_walk(node: Node, axis: int, direction: int, hops: int, n: int) -> Path:
    """Channels of ``hops`` steps along ``axis`` (plain torus: the wrap link only changes ``axis``)."""
    s, c = node
    out = []
    x = c[axis]
    for _ in range(hops):
        out.append((s, c[:axis] + (x,) + c[axis + 1:], axis, direction))
        x = (x + direction) % n
    return tuple(out)


def line_of(req: Request, axis: int, copies: int = 1, through: Node | None = None) -> Line:
    """The group's line along ``axis`` through its root (or ``through``): the whole axis, or its segment."""
    node = req.root if through is None else through
    if axis == req.dcn_axis or not req.segments:
        return axis_line(req.slice, axis, node, copies)
    seg = req.segment(axis)
    if seg.full(req.slice.dims[axis]):
        return axis_line(req.slice, axis, node, copies)
    return segment_line(req.slice, seg, node, copies)


def translate_roots(req: Request, over: Sequence[int]) -> list[Node]:
    """The root moved to every position of the group along the axes ``over`` (DCN included), root
    first: where the lines that a stage's ``copies`` stand for pass."""
    nodes = [req.root]
    for axis in over:
        if axis == req.dcn_axis:
            nodes = [(k, c) for _s, c in nodes for k in range(req.slice.num_slices)]
            continue
        seg = req.segment(axis)
        n = req.slice.dims[axis]
        nodes = [(s, c[:axis] + (seg.coord(i, n),) + c[axis + 1:]) for s, c in nodes for i in range(seg.size)]
    nodes.remove(req.root)
    return [req.root, *nodes]


def lines_for(req: Request, axis: int, over: Sequence[int]) -> list[Line]:
    """The lines along ``axis`` through every position of the group along ``over``: one
    representative standing for all of them on a healthy slice, each one on a faulted slice
    (module docstring)."""
    if not req.slice.faults:
        return [line_of(req, axis, math.prod(req.size(a) for a in over))]
    return [line_of(req, axis, 1, node) for node in translate_roots(req, over)]


def reroute(slice_: Slice, path: Path) -> Path:
    """One route or one edge of a line (ICI channels of one slice) around the failures, as
    ``Slice.route`` does; unchanged on a healthy slice, over DCN, and in slices other than 0."""
    if not path or not slice_.faults or path[0][0] != 0 or path[0][2] == DCN_AXIS:
        return path
    hops = [(c, slice_._step(c, axis, d), axis, d) for _s, c, axis, d in path]
    new = slice_.detour(hops)
    if new is hops:
        return path
    return tuple((0, u, axis, d) for u, _v, axis, d in new)


def _hop(slice_: Slice, nodes, i: int, j: int, axis: int, direction: int, exists: bool) -> Path:
    if not exists:
        return ()
    s, a = nodes[i]
    b = nodes[j][1]
    if slice_.neighbor(a, axis, direction) == b:
        return ((s, a, axis, direction),)
    return ici_path(slice_, a, b, s)  # twisted wrap: the ring does not close along the axis


def ring_line(slice_: Slice, nodes: Sequence[Node], copies: int = 1) -> Line:
    """A logical ring over nodes in the given order, each edge routed (irregular groups, snakes)."""
    nodes = tuple(nodes)
    n = len(nodes)
    fwd = tuple(node_path(slice_, nodes[i], nodes[(i + 1) % n]) for i in range(n))
    bwd = tuple(node_path(slice_, nodes[i], nodes[(i - 1) % n]) for i in range(n))
    return Line(nodes, True, fwd, bwd, False, copies, slice_)


def snake(slice_: Slice, axes: Sequence[int], through: Node,
          segments: Sequence[GroupSegment] = ()) -> list[Node]:
    """Nodes of the product of lines through ``through`` in boustrophedon order (first axis fastest),
    so consecutive nodes are neighbours: a ring over several axes with one-hop edges but the last.
    An axis with a ``GroupSegment`` contributes its chips (edges of ``stride`` hops) instead of all."""
    order: list[Node] = [through]
    s0 = through[0]
    segs = {g.axis: g for g in segments}
    for axis in axes:
        n = slice_.num_slices if axis == slice_.ndims else slice_.dims[axis]
        seg = segs.get(axis)
        coords = [seg.coord(i, n) for i in range(seg.size)] if seg is not None else list(range(n))
        grown: list[Node] = []
        for i, x in enumerate(coords):
            block = order if i % 2 == 0 else order[::-1]
            for s, c in block:
                if axis == slice_.ndims:
                    grown.append((i if s0 == 0 else (s0 + i) % n, c))
                else:
                    grown.append((s, c[:axis] + (x,) + c[axis + 1:]))
        order = grown
    return order


def group_snake(req: Request) -> list[Node]:
    """The group's members as a snake over its axes (or segments) through its root's lines."""
    return snake(req.slice, req.axes, req.root, req.segments)


def lines_per_axis(req: Request, axis: int) -> int:
    """How many translates of the line along ``axis`` make up the group."""
    return req.group_size // req.size(axis)
