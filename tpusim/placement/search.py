"""Every distinct placement of a mesh on a slice, one per class of torus symmetry (axes of equal length
and wraparound are interchangeable): the candidates ``--compare-placements`` prices."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from tpusim.placement.mesh import Mesh, Placement, Wanted, assign, check_fits, default_placement
from tpusim.slice.topology import Slice

MAX_PLACEMENTS = 24


def _factorizations(n: int, axes: list[tuple[int, int]]) -> Iterator[list[tuple[int, int]]]:
    """Ordered (axis, count) lists whose counts multiply to n, each count dividing its axis' room."""
    if n == 1:
        yield []
        return
    for i, (axis, room) in enumerate(axes):
        for take in range(2, min(n, room) + 1):
            if n % take == 0 and room % take == 0:
                rest = axes[:i] + axes[i + 1:]
                for tail in _factorizations(n // take, rest):
                    yield [(axis, take), *tail]


def _symmetries(slice_: Slice) -> list[tuple[int, ...]]:
    sig = [(slice_.dims[a], slice_.wrap[a]) for a in range(slice_.ndims)]
    return [p for p in itertools.permutations(range(slice_.ndims)) if all(sig[a] == sig[p[a]] for a in range(len(p)))]


def _key(p: Placement, perm: tuple[int, ...]) -> tuple:
    return tuple(tuple(sorted((perm[s.axis], s.size, s.stride) for s in segs)) for segs in p.dims)


def enumerate_placements(mesh: Mesh, slice_: Slice, limit: int = MAX_PLACEMENTS) -> list[Placement]:
    """Every distinct placement (default first), one per class of torus symmetry, at most ``limit``."""
    check_fits(mesh, slice_)
    first = default_placement(mesh, slice_)
    perms = _symmetries(slice_)
    seen = {min(_key(first, p) for p in perms)}
    out = [first]

    def place(d: int, used: list[int], wanted: Wanted) -> Iterator[Wanted]:
        if d < 0:
            yield wanted
            return
        room = [(a, slice_.dims[a] // used[a]) for a in range(slice_.ndims) if slice_.dims[a] // used[a] > 1]
        for combo in _factorizations(mesh.shape[d], room):
            nxt = list(used)
            for a, take in combo:
                nxt[a] *= take
            yield from place(d - 1, nxt, {**wanted, d: [(a, t) for a, t in combo]})

    for wanted in place(len(mesh.shape) - 1, [1] * slice_.ndims, {}):
        p = assign(mesh, slice_, wanted)
        key = min(_key(p, perm) for perm in perms)
        if key not in seen:
            seen.add(key)
            out.append(p)
            if len(out) >= limit:
                break
    return out
