"""Slice topologies: "2d:16x16", "3d:8x8x8" -> a torus of chips with coordinates, hops and routes.

Conventions (other modules code against these):

- **Axes.** ``dims`` lists axis lengths x first: "3d:4x8x16" has x=4, y=8, z=16. A shape with fewer
  axes than the chip generation's torus is padded with length-1 axes, so "2d:2x2" on v5p is the
  slice 2x2x1 and its ``spec`` reads "3d:2x2x1"; a shape with more axes than the chip has is an error.
- **Ranks.** ``rank = x + X*(y + Y*z)``: x varies fastest. ``coord_of`` is the inverse.
- **Wraparound** (per axis, from ``ChipSpec.wrap_rule`` unless ``build_slice(wrap=...)`` overrides):
  "cube" (v4, v5p, v7): every axis wraps when the slice is made of full cubes, i.e. every axis is a
  multiple of ``wrap_cube_size`` (4); otherwise no axis wraps (the wrap links come from optical
  switches that only exist on full cubes). "full_axis" (v5e, v6e): only an axis whose length equals
  ``wrap_cube_size`` (16) wraps, so 8x16 wraps y only. An axis of length 1 never wraps.
- **Links** are physical, bidirectional ICI links; each carries ``ici_link_bytes_per_s`` each way.
  An axis of length n >= 2 has n-1 links per ring, plus one wraparound link when it wraps; so a
  wrapped axis of length 2 has two parallel links between the same two chips. A one-way link is
  named by ``(src_coord, axis, direction)``; ``route`` yields exactly these, so it tells the two
  parallel links of a 2-ring apart.
- **Twisted tori** (v4/v5p, shapes k x k x 2k and k x 2k x 2k, every axis a multiple of 4): the
  wraparound link of each *short* axis also shifts every *long* axis by half its length (the
  twisted tori of Camara et al., IEEE TPDS 2010). That is the choice with the lowest diameter and
  mean distance among the simple twists (4x4x8: diameter 6 instead of 8); Google does not publish
  the exact wiring. The graph stays a Cayley graph, so ``hops`` is still a true graph distance.
- **Bisection** follows Google's published convention: links crossing the worst balanced cut times
  the one-way link bandwidth (v5e 16x16: 32 links x 50 GB/s = 1.6 TB/s). The cut is the cheapest
  of the axis-aligned halving cuts (for a uniformly wrapped torus: the longest axis cut in half).

``hops``/``route``/``diameter_hops``/``bisection_links`` are O(dims) arithmetic; the networkx
graph is built lazily, only for whoever asks for ``Slice.graph`` (tests, plots).

**Faults** (``Slice.faults``; ``tpusim.slice.faults`` parses ``--fail-links``/``--fail-chips`` and
applies them). A failed link loses both of its one-way channels; a failed chip loses all its
links. ``route`` is then *dimension-order routing with detours*: the usual route where it
meets no failure; otherwise a shortest path over the working links, taking at every chip the
first move of x+, x-, y+, y-, z+, z- that stays on a shortest path (so it keeps dimension order
where it can). On a 4-ring with x+@(0,0,0) failed, 0 -> 1 goes the long way round,
0 -> 3 -> 2 -> 1 (three hops, as every way around is); on an 8-ring it steps aside instead,
x+@(0,1,0) one line over (y+, x+, y-). A route from or to a failed chip, or between chips the
failures cut apart, is a ``FaultError``. ``hops``, ``diameter_hops`` and the bisection stay
those of the healthy slice (``Slice.healthy``). Faults name chips of slice 0.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property, lru_cache

import networkx as nx

from tpusim.errors import TpusimError, plain_text, shown
from tpusim.hardware import calibration as _calibration
from tpusim.hardware import spec as _spec
from tpusim.hardware.spec import ChipSpec
from tpusim.slice.shapes import shape_note

AXIS_NAMES = ("x", "y", "z")

Coord = tuple[int, ...]
Hop = tuple[Coord, Coord, int, int]  # (src, dst, axis, direction)
LinkKey = tuple[Coord, int]          # a physical link: the one leaving coord in the + direction of axis


class FaultError(TpusimError):
    """A route or a collective cannot complete on a faulted slice (a failed chip in the way, or
    failures that cut two chips apart)."""


@dataclass(frozen=True)
class Faults:
    """Links and chips removed from a slice (see the module docstring; ``tpusim.slice.faults`` builds them)."""

    links: frozenset[LinkKey] = frozenset()   # failed physical links, each as (coord, axis): the + link
    chips: frozenset[Coord] = frozenset()     # failed chips (their links fail with them)
    seed: int | None = None                   # the --fault-seed that drew them, when drawn at random

    def __bool__(self) -> bool:
        return bool(self.links or self.chips)


NO_FAULTS = Faults()


def format_coord(coord: Coord) -> str:
    """(1, 0, 0) -> '(1,0,0)', as --fail-chips takes it."""
    return "(" + ",".join(map(str, coord)) + ")"
_MOVES = ((0, 1), (0, -1), (1, 1), (1, -1), (2, 1), (2, -1))   # detour preference: x+, x-, y+, y-, z+, z-

_ACCEPTED = "accepted forms: 1d:N, 2d:AxB, 3d:AxBxC with positive integers, e.g. 2d:16x16 or 3d:8x8x8"
_SPEC_RE = re.compile(r"([123])[dD]:([0-9]+(?:[xX][0-9]+)*)", re.ASCII)
MAX_AXIS_DIGITS = 6             # an axis length of 1,000,000 chips or more is no TPU slice
MAX_SLICES = 1024               # multislice: slices joined over DCN (the largest published jobs use ~200)


def parse_topology(spec: str) -> tuple[int, ...]:
    """Parse "1d:N", "2d:AxB" or "3d:AxBxC" into axis lengths, x first. Spaces around it are ignored;
    anything but printable ASCII (a tab, a newline, Unicode digits) is refused."""
    text = plain_text(spec, "bad topology", _ACCEPTED, max_length=64).strip(" ")
    m = _SPEC_RE.fullmatch(text)
    if m is None:
        raise TpusimError(f"bad topology {shown(spec)}: {_ACCEPTED}")
    ndims = int(m.group(1))
    parts = re.split("[xX]", m.group(2))
    if max(len(p.lstrip("0")) for p in parts) > MAX_AXIS_DIGITS:
        raise TpusimError(f"bad topology {shown(spec)}: an axis length has more than {MAX_AXIS_DIGITS} digits, "
                          f"larger than any TPU slice; {_ACCEPTED}")
    dims = tuple(int(p) for p in parts)
    if len(dims) != ndims:
        raise TpusimError(f"bad topology {shown(spec)}: '{ndims}d:' needs {ndims} lengths, got {len(dims)}; "
                          f"{_ACCEPTED}")
    if min(dims) < 1:
        raise TpusimError(f"bad topology {shown(spec)}: every axis length must be >= 1; {_ACCEPTED}")
    return dims


def parse_slices(text: str | int, flag: str = "--slices") -> int:
    """``--slices N``: a whole number of slices from 1 to ``MAX_SLICES``, in ASCII digits."""
    accepted = f"accepted: a whole number from 1 to {MAX_SLICES}"
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        word = plain_text(text, flag, accepted, max_length=32).strip(" ")
        if not re.fullmatch(r"[+-]?[0-9]{1,10}", word, re.ASCII):
            raise TpusimError(f"{flag} {shown(text)} is not a whole number; {accepted}")
        value = int(word)
    if not 1 <= value <= MAX_SLICES:
        raise TpusimError(f"{flag} {value} is out of range; {accepted}")
    return value


def slices_flag(text: str) -> int:
    """``parse_slices`` as an argparse type: its message becomes argparse's one-line usage error (exit 2)."""
    import argparse

    try:
        return parse_slices(text)
    except TpusimError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix("--slices ")) from None


_CHIP_ACCEPTED = "give a chip name such as v5p (see `tpusim chips`) or the path of a .toml chip file"


def parse_chip_name(text: str) -> str:
    """``--chip``: a generation name (v5p) or the path of a chip TOML file, checked before any file is
    looked at (printable, no tab or newline, no name longer than a file system takes); whether it exists
    is ``spec.load_chip``'s to say."""
    name = plain_text(text, "--chip", _CHIP_ACCEPTED, max_length=1024, ascii_only=False).strip(" ")
    if not name or max(len(part) for part in name.split("/")) > 255:
        raise TpusimError(f"--chip {shown(text)} is not a chip name or a file path; {_CHIP_ACCEPTED}")
    return name


def load_chip_arg(chip: str) -> ChipSpec:
    """``spec.load_chip`` of a ``--chip`` value: checked first, and a file that cannot be read is a
    TpusimError, not an OSError."""
    name = parse_chip_name(chip)
    try:
        return _spec.load_chip(name)
    except OSError as error:
        raise TpusimError(f"--chip {shown(chip)}: cannot read it: {error.strerror or error}") from None


def format_topology(dims: tuple[int, ...]) -> str:
    """Inverse of ``parse_topology``: (8, 8, 8) -> "3d:8x8x8"."""
    return f"{len(dims)}d:" + "x".join(str(n) for n in dims)


def _fmt_shape(dims: tuple[int, ...]) -> str:
    return "x".join(str(n) for n in dims)


def twist_capable(dims: tuple[int, ...], cube: int = 4) -> bool:
    """True for shapes a twisted torus exists for: k x k x 2k or k x 2k x 2k, axes multiples of ``cube``."""
    if len(dims) != 3 or any(n % cube for n in dims):
        return False
    a, b, c = sorted(dims)
    return (a == b and c == 2 * a) or (b == c and b == 2 * a)


def _ring_step(d: int, n: int, wrap: bool) -> int:
    """Signed steps for offset d along one axis: shortest way round when wrapped, ties -> +1."""
    if not wrap:
        return d
    d %= n
    return d - n if 2 * d > n else d


@dataclass(frozen=True)
class Slice:
    """One ICI slice (a mesh or torus of chips), repeated ``num_slices`` times over DCN.

    Build it with ``build_slice``, which applies the chip's rules; the constructor trusts its input.
    """

    spec: str
    dims: tuple[int, ...]
    wrap: tuple[bool, ...]
    twisted: bool
    chip: ChipSpec
    num_slices: int = 1
    default_chip_used: bool = False
    faults: Faults = NO_FAULTS
    shape_note: str | None = None     # not a shape the chip is offered in (tpusim.slice.shapes); priced anyway

    # ---- sizes -------------------------------------------------------------------------------
    @property
    def label(self) -> str:
        """The spec, and the slice count when several are joined over DCN: '2d:4x4 x 2 slices'."""
        return self.spec + (f" x {self.num_slices} slices" if self.num_slices > 1 else "")

    @property
    def ndims(self) -> int:
        return len(self.dims)

    @property
    def axis_names(self) -> tuple[str, ...]:
        return AXIS_NAMES[: self.ndims]

    @cached_property
    def num_chips(self) -> int:
        """Chips in one slice."""
        n = 1
        for d in self.dims:
            n *= d
        return n

    @property
    def total_chips(self) -> int:
        """Chips in all slices together."""
        return self.num_chips * self.num_slices

    @property
    def hosts(self) -> int:
        """Hosts over all slices; a slice smaller than a host still takes one host."""
        per_slice = -(-self.num_chips // self.chip.chips_per_host)
        return per_slice * self.num_slices

    def axis_links(self, axis: int) -> int:
        """Physical links along ``axis`` in one slice."""
        n = self.dims[axis]
        if n == 1:
            return 0
        rings = self.num_chips // n
        return rings * (n if self.wrap[axis] else n - 1)

    @property
    def num_links(self) -> int:
        """Physical (bidirectional) ICI links in one slice."""
        return sum(self.axis_links(a) for a in range(self.ndims))

    # ---- coordinates -------------------------------------------------------------------------
    def _check_coord(self, coord: Coord) -> None:
        if len(coord) != self.ndims or any(not 0 <= c < n for c, n in zip(coord, self.dims, strict=True)):
            raise TpusimError(f"coordinate {tuple(coord)} is not in slice {self.spec}: "
                              f"expected {self.ndims} integers with 0 <= c < {_fmt_shape(self.dims)}")

    def rank_of(self, coord: Coord) -> int:
        """Rank of a chip: x + X*(y + Y*z), x fastest."""
        self._check_coord(coord)
        rank = 0
        for c, n in zip(reversed(coord), reversed(self.dims), strict=True):
            rank = rank * n + c
        return rank

    def coord_of(self, rank: int) -> Coord:
        """Coordinate of a rank (inverse of ``rank_of``)."""
        if not 0 <= rank < self.num_chips:
            raise TpusimError(f"rank {rank} is not in slice {self.spec}: "
                              f"expected 0 <= rank < {self.num_chips}")
        out = []
        for n in self.dims:
            rank, c = divmod(rank, n)
            out.append(c)
        return tuple(out)

    def coords(self) -> Iterator[Coord]:
        """Every coordinate, in rank order."""
        for c in itertools.product(*(range(n) for n in reversed(self.dims))):
            yield tuple(reversed(c))

    # ---- twist -------------------------------------------------------------------------------
    @cached_property
    def _long_axes(self) -> tuple[int, ...]:
        return tuple(a for a, n in enumerate(self.dims) if n == max(self.dims)) if self.twisted else ()

    @cached_property
    def _shifts(self) -> tuple[tuple[tuple[int, int], ...], ...]:
        """Per axis: (other axis, shift) applied when its wraparound link is crossed in the + direction."""
        if not self.twisted:
            return tuple(() for _ in self.dims)
        return tuple(
            () if a in self._long_axes else tuple((j, self.dims[j] // 2) for j in self._long_axes)
            for a in range(self.ndims)
        )

    # ---- neighbours, distances, routes ---------------------------------------------------------
    def neighbor(self, coord: Coord, axis: int, direction: int) -> Coord | None:
        """The chip one link away along ``axis`` in ``direction`` (+1/-1), or None where no link is."""
        self._check_coord(coord)
        if direction not in (1, -1) or not 0 <= axis < self.ndims:
            raise TpusimError(f"bad step (axis={axis}, direction={direction}) in slice {self.spec}: "
                              f"expected 0 <= axis < {self.ndims} and direction +1 or -1")
        return self._step(coord, axis, direction)

    def axis_hops(self, a: int, b: int, axis: int) -> int:
        """Hops between positions a and b along one axis's ring or line (ignores any twist)."""
        return abs(_ring_step(b - a, self.dims[axis], self.wrap[axis]))

    def steps(self, coord_a: Coord, coord_b: Coord) -> tuple[int, ...]:
        """Signed steps per axis of a shortest path a -> b (ties: no twisted wrap, then +1)."""
        self._check_coord(coord_a)
        self._check_coord(coord_b)
        d = [b - a for a, b in zip(coord_a, coord_b, strict=True)]
        if not self.twisted:
            return tuple(_ring_step(x, n, w) for x, n, w in zip(d, self.dims, self.wrap, strict=True))
        # Twisted: the lattice is generated by n_s*e_s - shift_s (short axes s) and n_j*e_j (long axes j).
        # Choose how often each short axis crosses its wrap (-1, 0, +1 suffice: shifts are half the
        # long lengths), then go the shortest way round the long axes.
        short = [a for a in range(self.ndims) if self._shifts[a]]
        best: tuple[int, ...] | None = None
        for crossings in itertools.product((0, -1, 1), repeat=len(short)):
            m = list(d)
            for s, c in zip(short, crossings, strict=True):
                m[s] += c * self.dims[s]
                for j, sh in self._shifts[s]:
                    m[j] -= c * sh
            for j in self._long_axes:
                m[j] = _ring_step(m[j], self.dims[j], True)
            if best is None or sum(map(abs, m)) < sum(map(abs, best)):
                best = tuple(m)
        assert best is not None
        return best

    def hops(self, coord_a: Coord, coord_b: Coord) -> int:
        """Shortest-path hop count between two chips (a true graph distance, twist included)."""
        return sum(abs(s) for s in self.steps(coord_a, coord_b))

    def route(self, coord_a: Coord, coord_b: Coord) -> list[Hop]:
        """Dimension-order route (x, then y, then z), shortest direction per axis; len == hops."""
        path: list[Hop] = []
        cur = tuple(coord_a)
        for axis, s in enumerate(self.steps(coord_a, coord_b)):
            direction = 1 if s > 0 else -1
            for _ in range(abs(s)):
                nxt = self.neighbor(cur, axis, direction)
                assert nxt is not None, "steps() only moves along existing links"
                path.append((cur, nxt, axis, direction))
                cur = nxt
        return self.detour(path) if self.faults else path

    @property
    def diameter_hops(self) -> int:
        """Largest hop count between two chips of one slice (closed form)."""
        if self.twisted:
            # Both twisted families (k x k x 2k, k x 2k x 2k, k a multiple of 4) have diameter 3k/2;
            # tests check this against the graph.
            return 3 * min(self.dims) // 2
        return sum(n // 2 if w else n - 1 for n, w in zip(self.dims, self.wrap, strict=True))

    def cut_links(self, axis: int) -> int:
        """Links crossing the cut that halves ``axis`` (coordinate < n//2 vs the rest)."""
        n = self.dims[axis]
        if n == 1:
            return 0
        rings = self.num_chips // n
        links = rings * (2 if self.wrap[axis] else 1)
        # A twisted wrap link that shifts this axis by n/2 always lands in the other half.
        for b in range(self.ndims):
            if any(j == axis for j, _ in self._shifts[b]):
                links += self.num_chips // self.dims[b]
        return links

    @property
    def bisection_links(self) -> int:
        """Links crossing the cheapest axis-aligned halving cut of one slice (0 for one chip).

        That is the true minimum bisection for meshes and tori with even axes (tests brute-force tiny
        ones); for twisted tori it is an upper bound (their best cut need not be axis-aligned).
        """
        cuts = [self.cut_links(a) for a in range(self.ndims) if self.dims[a] > 1]
        return min(cuts) if cuts else 0

    @property
    def bisection_bytes_per_s(self) -> float:
        """Bisection bandwidth of one slice, Google's convention: cut links x one-way link bandwidth."""
        return self.bisection_links * self.chip.ici_link_bytes_per_s

    # ---- faults ------------------------------------------------------------------------------
    @cached_property
    def healthy(self) -> Slice:
        """The same slice with every link and chip working."""
        return self if not self.faults else dataclasses.replace(self, faults=NO_FAULTS)

    def _step(self, coord: Coord, axis: int, direction: int) -> Coord | None:
        """``neighbor`` without its argument checks (hot in detour searches)."""
        n = self.dims[axis]
        v = coord[axis] + direction
        out = list(coord)
        if 0 <= v < n:
            out[axis] = v
            return tuple(out)
        if n == 1 or not self.wrap[axis]:
            return None
        out[axis] = v % n
        for j, s in self._shifts[axis]:
            out[j] = (out[j] + direction * s) % self.dims[j]
        return tuple(out)

    def link_key(self, coord: Coord, axis: int, direction: int) -> LinkKey | None:
        """The physical link a one-way channel belongs to, named by its + end; None where none is."""
        if direction > 0:
            return None if self._step(coord, axis, 1) is None else (tuple(coord), axis)
        back = self._step(coord, axis, -1)
        return None if back is None else (back, axis)

    def link_name(self, key: LinkKey) -> str:
        """((0, 0, 0), 0) -> 'x+@(0,0,0)', the form --fail-links takes."""
        coord, axis = key
        return f"{self.axis_names[axis]}+@{format_coord(coord)}"

    def channel_failed(self, coord: Coord, axis: int, direction: int) -> bool:
        """True when the channel leaving ``coord`` along ``axis`` in ``direction`` is gone (its link,
        or a chip at either end, has failed). Always False on a healthy slice."""
        f = self.faults
        if not f:
            return False
        nxt = self._step(coord, axis, direction)
        if nxt is None or coord in f.chips or nxt in f.chips:
            return True
        return ((coord, axis) if direction > 0 else (nxt, axis)) in f.links

    @cached_property
    def failed_links(self) -> frozenset[LinkKey]:
        """Every physical link that is gone: the failed ones and those of failed chips."""
        out = set(self.faults.links)
        for c in self.faults.chips:
            for axis in range(self.ndims):
                for d in (1, -1):
                    key = self.link_key(c, axis, d)
                    if key is not None:
                        out.add(key)
        return frozenset(out)

    def detour(self, path: list[Hop]) -> list[Hop]:
        """``path`` (one route, src -> dst) itself when every hop of it works, else the detour around
        the failures from its first chip to its last (module docstring)."""
        if not path or not self.faults:
            return path
        if not any(self.channel_failed(u, axis, d) for u, _v, axis, d in path):
            return path
        src, dst = path[0][0], path[-1][1]
        for end in (src, dst):
            if end in self.faults.chips:
                raise FaultError(f"chip {format_coord(end)} has failed (--fail-chips): nothing can be sent "
                                 f"from or to it")
        return list(_around(self, src, dst))

    # ---- graph -------------------------------------------------------------------------------
    @cached_property
    def graph(self) -> nx.MultiGraph:
        """One slice as a networkx MultiGraph: nodes are coords (attr rank), edges carry axis and wrap."""
        g = nx.MultiGraph()
        for rank, c in enumerate(self.coords()):
            g.add_node(c, rank=rank)
        for c in self.coords():
            for axis, n in enumerate(self.dims):
                if n == 1:
                    continue
                nxt = self.neighbor(c, axis, 1)
                if nxt is not None:
                    g.add_edge(c, nxt, axis=axis, wrap=c[axis] == n - 1)
        return g

    # ---- report ------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        """JSON-ready summary for reports and ``tpusim topology``; ICI figures are per slice."""
        return {
            "spec": self.spec,
            "chip": self.chip.name,
            "default_chip_used": self.default_chip_used,
            "shape_note": self.shape_note,
            "dims": list(self.dims),
            "axis_names": list(self.axis_names),
            "wrap": list(self.wrap),
            "twisted": self.twisted,
            "slices": self.num_slices,
            "chips_per_slice": self.num_chips,
            "chips": self.total_chips,
            "hosts": self.hosts,
            "links": self.num_links,
            "diameter_hops": self.diameter_hops,
            "bisection_links": self.bisection_links,
            "bisection_bytes_per_s": self.bisection_bytes_per_s,
            "ici_link_bytes_per_s": self.chip.ici_link_bytes_per_s,
            "ici_hop_latency_ns": self.chip.ici_hop_latency_ns,
            "dcn_bytes_per_s": self.chip.dcn_bytes_per_s,
            "dcn_slice_bytes_per_s": self.chip.dcn_bytes_per_s * self.num_chips,  # one slice's DCN egress
            **({"faults": self.faults_dict()} if self.faults else {}),
        }

    def faults_dict(self) -> dict:
        """The report's view of the faults: what failed (in --fail-links/--fail-chips form) and what is left."""
        gone = self.failed_links
        return {"failed_links": sorted(self.link_name(k) for k in self.faults.links),
                "failed_chips": [list(c) for c in sorted(self.faults.chips)],
                "seed": self.faults.seed, "links_lost": len(gone), "links_working": self.num_links - len(gone)}


@lru_cache(maxsize=256)
def _distances(slice_: Slice, target: Coord) -> dict[Coord, int]:
    """Hops from every chip to ``target`` over working links (breadth-first; links are two-way)."""
    dist = {target: 0}
    frontier = [target]
    moves = [(a, d) for a, d in _MOVES if a < slice_.ndims and slice_.dims[a] > 1]
    while frontier:
        nxt_frontier = []
        for c in frontier:
            for axis, d in moves:
                nxt = slice_._step(c, axis, d)
                if nxt is not None and nxt not in dist and not slice_.channel_failed(c, axis, d):
                    dist[nxt] = dist[c] + 1
                    nxt_frontier.append(nxt)
        frontier = nxt_frontier
    return dist


@lru_cache(maxsize=4096)
def _around(slice_: Slice, src: Coord, dst: Coord) -> tuple[Hop, ...]:
    """The detour src -> dst: a shortest path over working links, taking at each chip the first move
    of x+, x-, y+, y-, z+, z- that stays on a shortest path."""
    dist = _distances(slice_, dst)
    if src not in dist:
        raise FaultError(f"no route from chip {format_coord(src)} to chip {format_coord(dst)}: the failed "
                         f"links and chips cut them apart")
    moves = [(a, d) for a, d in _MOVES if a < slice_.ndims and slice_.dims[a] > 1]
    out = []
    cur = src
    while cur != dst:
        for axis, d in moves:
            nxt = slice_._step(cur, axis, d)
            if nxt is not None and dist.get(nxt) == dist[cur] - 1 and not slice_.channel_failed(cur, axis, d):
                out.append((cur, nxt, axis, d))
                cur = nxt
                break
    return tuple(out)


def default_wrap(dims: tuple[int, ...], chip: ChipSpec) -> tuple[bool, ...]:
    """Which axes wrap on real hardware of this generation (see the module docstring)."""
    if chip.wrap_rule == "cube":
        full = all(n % chip.wrap_cube_size == 0 for n in dims)
        return tuple(full and n > 1 for n in dims)
    if chip.wrap_rule == "full_axis":
        return tuple(n == chip.wrap_cube_size and n > 1 for n in dims)
    raise TpusimError(f"chip {chip.name} has wrap_rule {chip.wrap_rule!r}: accepted 'cube' or 'full_axis'")


def _resolve_chip(chip: str | ChipSpec | None, ndims: int) -> tuple[ChipSpec, bool]:
    if isinstance(chip, ChipSpec):
        return chip, False
    if chip is None:
        return _spec.default_chip_for_dims(ndims), True
    return load_chip_arg(chip), False


def _check_fits(spec: str, dims: tuple[int, ...], cs: ChipSpec) -> None:
    """Cube-built generations (v4/v5p) join 4x4x4 cubes through optical switches in any
    arrangement, so their limit is the chip count (MLPerf v4.0 ran v5p as 8x16x48, longer
    than the 24 of the doc's largest listed shape); fixed tori (v5e/v6e) fit axis by axis."""
    max_shape = tuple(cs.max_slice_shape)
    if cs.wrap_rule == "cube":
        if math.prod(dims) > math.prod(max_shape):
            raise TpusimError(f"topology {spec} has {math.prod(dims)} chips, more than the largest "
                              f"{cs.name} slice ({_fmt_shape(max_shape)} = {math.prod(max_shape)} chips); "
                              f"use slices=N for multislice")
    elif len(max_shape) == len(dims) and any(d > m for d, m in zip(sorted(dims), sorted(max_shape))):
        raise TpusimError(f"topology {spec} does not fit one {cs.name} slice: the largest is "
                          f"{_fmt_shape(max_shape)} (axes in any order); use slices=N for multislice")


def build_slice(
    spec: str,
    chip: str | ChipSpec | None = None,
    wrap: tuple[bool, ...] | None = None,
    slices: int = 1,
    twisted: bool | None = None,
    calibrated: bool = False,
) -> Slice:
    """Build a slice from a topology string, applying the chip generation's shape and wrap rules.

    ``chip`` defaults to ``spec.default_chip_for_dims(ndims)`` (the chip files say: 2d -> v6e, 3d -> v5p);
    ``wrap`` overrides the hardware rule per axis (for what-if studies); ``slices`` > 1 joins identical slices over DCN;
    ``twisted`` asks for a twisted torus (only legal shapes on twist-capable generations); ``calibrated``
    applies the generation's calibration (``tpusim.hardware.calibration``: what compiled programs achieve of
    the datasheet), as every pricing command does unless told ``--no-calibration``.
    """
    dims = parse_topology(spec)
    cs, default_used = _resolve_chip(chip, len(dims))
    if calibrated:
        cs = _calibration.calibrated(cs)
    want = cs.torus_dims
    if len(dims) > want:
        raise TpusimError(f"topology {spec} has {len(dims)} axes but {cs.name} is a {want}D torus: "
                          f"use {want}d:{'x'.join('ABC'[:want])}, or a 3D generation such as "
                          f"{_spec.default_chip_for_dims(3).name}")
    given = len(dims)
    dims = dims + (1,) * (want - given)
    _check_fits(spec, dims, cs)
    if not isinstance(slices, int) or isinstance(slices, bool) or not 1 <= slices <= MAX_SLICES:
        raise TpusimError(f"slices={shown(slices)}: expected a whole number from 1 to {MAX_SLICES}")

    if wrap is None:
        wraps = default_wrap(dims, cs)
    else:
        wrap = tuple(bool(w) for w in wrap)
        if len(wrap) not in (given, len(dims)):
            raise TpusimError(f"wrap={wrap} for {spec}: expected one flag per axis ({len(dims)} for "
                              f"{format_topology(dims)})")
        wrap = wrap + (False,) * (len(dims) - len(wrap))
        wraps = tuple(w and n > 1 for w, n in zip(wrap, dims, strict=True))

    if twisted:
        if not cs.twisted_tori:
            raise TpusimError(f"{cs.name} has no twisted tori: twisting needs a v4/v5p-style generation")
        if not twist_capable(dims, cs.wrap_cube_size):
            raise TpusimError(f"topology {spec} cannot be twisted: twisted tori are k x k x 2k or "
                              f"k x 2k x 2k with every axis a multiple of {cs.wrap_cube_size} "
                              f"(e.g. 4x4x8, 4x8x8, 8x8x16, 8x16x16)")
        if not all(wraps):
            raise TpusimError(f"topology {spec} cannot be twisted with wrap={wraps}: a twisted torus "
                              f"wraps every axis")
    return Slice(spec=format_topology(dims), dims=dims, wrap=wraps, twisted=bool(twisted), chip=cs,
                 num_slices=slices, default_chip_used=default_used, shape_note=shape_note(dims, cs))
