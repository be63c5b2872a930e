"""Slice topology: hand-checkable counts, published rules, and the graph as the independent truth."""

from __future__ import annotations

import dataclasses
import itertools
import json
import random

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpusim.errors import TpusimError
from tpusim.hardware.spec import ChipSpec, load_chip
from tpusim.slice.topology import (
    AXIS_NAMES,
    Slice,
    build_slice,
    format_topology,
    parse_topology,
    twist_capable,
)

# The rule-relevant fields of each generation, used only while a chip file is not in topologies/ yet.
_FALLBACK = {
    "v5e": dict(torus_dims=2, wrap_rule="full_axis", wrap_cube_size=16, twisted_tori=False,
                max_slice_shape=(16, 16), ici_link_bytes_per_s=4.5e10, chips_per_host=8),
    "v6e": dict(torus_dims=2, wrap_rule="full_axis", wrap_cube_size=16, twisted_tori=False,
                max_slice_shape=(16, 16), ici_link_bytes_per_s=9e10, chips_per_host=8),
    "v5p": dict(torus_dims=3, wrap_rule="cube", wrap_cube_size=4, twisted_tori=True,
                max_slice_shape=(16, 16, 24), ici_link_bytes_per_s=9e10, chips_per_host=4),
}


def chip(name: str) -> ChipSpec:
    """The real chip from topologies/ when its file exists, else a stand-in with the same rules."""
    try:
        return load_chip(name)
    except TpusimError:
        blank = {f.name: "" if f.type in ("str", str) else False if f.type in ("bool", bool) else 0
                 for f in dataclasses.fields(ChipSpec)}
        return ChipSpec(**{**blank, "name": name, "display_name": name, **_FALLBACK[name]})


def lab3d() -> ChipSpec:
    """A 3D chip without a size limit, for what-if shapes with explicit wrap flags."""
    return dataclasses.replace(chip("v5p"), name="lab3d", max_slice_shape=(64, 64, 64))


def degree_on_axis(n: int, wrapped: bool, c: int) -> int:
    if n == 1:
        return 0
    if wrapped:
        return 2  # for n == 2: two parallel links to the same neighbour
    return 1 if c in (0, n - 1) else 2


def check_against_graph(s: Slice, pairs: int | None = None) -> None:
    """hops == graph distance, routes are walks on real links, degrees and link counts match."""
    g = s.graph
    assert g.number_of_nodes() == s.num_chips
    assert g.number_of_edges() == s.num_links
    for c in s.coords():
        want = sum(degree_on_axis(n, w, x) for n, w, x in zip(s.dims, s.wrap, c, strict=True))
        assert g.degree(c) == want
    nodes = list(s.coords())
    sources = nodes if pairs is None else random.Random(0).sample(nodes, min(pairs, len(nodes)))
    for a in sources:
        dist = nx.single_source_shortest_path_length(g, a)
        for b in nodes:
            assert s.hops(a, b) == dist[b], (a, b)
            route = s.route(a, b)
            assert len(route) == dist[b]
            cur = a
            for src, dst, axis, direction in route:
                assert src == cur and s.neighbor(src, axis, direction) == dst
                assert any(e["axis"] == axis for e in g.get_edge_data(src, dst).values())
                cur = dst
            assert cur == b


# ---- parsing --------------------------------------------------------------------------------------

def test_parse_examples() -> None:
    assert parse_topology("1d:8") == (8,)
    assert parse_topology("2d:16x16") == (16, 16)
    assert parse_topology("3d:4x8x16") == (4, 8, 16)
    assert parse_topology(" 3D:8X8X8 ") == (8, 8, 8)
    assert format_topology((4, 8, 16)) == "3d:4x8x16"


@pytest.mark.parametrize("bad", ["3d:8x8", "2d:0x4", "4d:2x2x2x2", "3d:8x8x8x", "8x8x8", "", "garbage",
                                 "2d:4x-4", "3d:8 x8x8", "2d:4x4x4", "1d:", "d:4", "2d:4.0x4"])
def test_parse_rejects(bad: str) -> None:
    with pytest.raises(TpusimError, match="accepted forms"):
        parse_topology(bad)


@given(st.lists(st.integers(1, 10_000), min_size=1, max_size=3))
def test_parse_round_trip(dims: list[int]) -> None:
    assert parse_topology(format_topology(tuple(dims))) == tuple(dims)


@st.composite
def malformed(draw: st.DrawFn) -> str:
    dims = draw(st.lists(st.integers(1, 64), min_size=1, max_size=4))
    body = "x".join(map(str, dims))
    kind = draw(st.sampled_from(["count", "zero", "trailing", "noprefix", "sep", "prefix"]))
    if kind == "count":
        k = draw(st.integers(1, 5).filter(lambda k: k != len(dims)))
        return f"{k}d:{body}"
    if kind == "zero":
        dims[draw(st.integers(0, len(dims) - 1))] = 0
        return f"{len(dims)}d:" + "x".join(map(str, dims))
    if kind == "trailing":
        return f"{len(dims)}d:{body}x"
    if kind == "noprefix":
        return body
    if kind == "sep":
        return f"{len(dims)}d:" + draw(st.sampled_from([",", "*", "-", " "])).join(map(str, dims)) + \
            ("" if len(dims) > 1 else ",")
    return draw(st.sampled_from(["0d:", "4d:", "3:", "3d", "d:"])) + body


@given(malformed())
def test_parse_rejects_malformed(text: str) -> None:
    with pytest.raises(TpusimError):
        parse_topology(text)


# ---- hand-checkable slices ---------------------------------------------------------------------

def test_4x4_torus_forced_wrap() -> None:
    s = build_slice("2d:4x4", chip("v6e"), wrap=(True, True))
    assert (s.num_chips, s.num_links, s.diameter_hops) == (16, 32, 4)
    assert s.bisection_links == 8
    check_against_graph(s)


def test_4x4x4_v5p_full_cube() -> None:
    s = build_slice("3d:4x4x4", "v5p")
    assert s.wrap == (True, True, True) and not s.twisted
    assert s.num_links == 192
    assert all(d == 6 for _, d in s.graph.degree())
    assert s.diameter_hops == 6
    check_against_graph(s, pairs=4)


def test_8x8x8_default_chip_is_v5p() -> None:
    s = build_slice("3d:8x8x8")
    assert s.chip.name == "v5p" and s.default_chip_used
    assert (s.num_chips, s.wrap, s.twisted) == (512, (True, True, True), False)
    assert s.hosts == 512 // s.chip.chips_per_host
    assert s.diameter_hops == 12
    assert s.axis_names == AXIS_NAMES


@pytest.mark.parametrize("spec, dims", [("3d:2x2x1", (2, 2, 1)), ("3d:2x2x2", (2, 2, 2)),
                                        ("3d:2x4x4", (2, 4, 4)), ("2d:2x2", (2, 2, 1))])
def test_small_v5p_slices_do_not_wrap(spec: str, dims: tuple[int, ...]) -> None:
    s = build_slice(spec, "v5p")
    assert s.dims == dims and not any(s.wrap)
    assert s.spec == format_topology(dims)
    check_against_graph(s)


def test_v6e_wraps_only_axes_of_16() -> None:
    s = build_slice("2d:8x16")
    assert s.chip.name == "v6e" and s.default_chip_used
    assert s.wrap == (False, True)
    assert s.num_links == 7 * 16 + 8 * 16
    assert build_slice("2d:16x16").wrap == (True, True)
    assert build_slice("2d:4x4").wrap == (False, False)
    assert build_slice("1d:16", "v6e").dims == (16, 1)


def test_ring_of_8_hops() -> None:
    ring = build_slice("1d:8", "v6e", wrap=(True,))
    line = build_slice("1d:8", "v6e", wrap=(False,))
    a, b = ring.coord_of(0), ring.coord_of(7)
    assert ring.hops(a, b) == 1 and line.hops(a, b) == 7
    assert ring.axis_hops(0, 7, 0) == 1 and line.axis_hops(0, 7, 0) == 7
    assert ring.route(a, b) == [(a, b, 0, -1)]
    assert ring.hops(a, ring.coord_of(4)) == 4 and ring.route(a, ring.coord_of(4))[0][3] == 1  # tie -> +1
    assert ring.diameter_hops == 4 and line.diameter_hops == 7


def test_two_ring_has_parallel_links() -> None:
    s = build_slice("1d:2", "v6e", wrap=(True,))
    assert s.num_links == 2 and s.graph.number_of_edges((0, 0), (1, 0)) == 2
    assert {e["wrap"] for e in s.graph.get_edge_data((0, 0), (1, 0)).values()} == {True, False}
    assert s.neighbor((0, 0), 0, 1) == s.neighbor((0, 0), 0, -1) == (1, 0)
    assert s.bisection_links == 2


def test_rank_order_x_fastest() -> None:
    s = build_slice("3d:4x8x16", "v5p")
    assert s.coord_of(1) == (1, 0, 0) and s.coord_of(4) == (0, 1, 0) and s.coord_of(32) == (0, 0, 1)
    assert s.rank_of((3, 7, 15)) == s.num_chips - 1
    assert [s.rank_of(c) for c in s.coords()] == list(range(s.num_chips))


def test_route_is_dimension_ordered() -> None:
    s = build_slice("3d:8x8x8", "v5p")
    a, b = (1, 2, 3), (6, 0, 7)
    route = s.route(a, b)
    axes = [h[2] for h in route]
    assert axes == sorted(axes) and len(route) == s.hops(a, b) == 3 + 2 + 4
    assert [h[3] for h in route] == [-1] * 3 + [-1] * 2 + [1] * 4
    assert s.route(a, a) == []


def test_bisection_matches_published_v5e_pod() -> None:
    s = build_slice("2d:16x16", "v5e")
    assert s.bisection_links == 32
    assert s.bisection_bytes_per_s == pytest.approx(1.6e12, rel=0.15)  # v5e doc: 1.6 TB/s per pod


def test_multislice() -> None:
    s = build_slice("2d:16x16", "v6e", slices=4)
    assert (s.num_chips, s.total_chips, s.num_slices) == (256, 1024, 4)
    d = s.to_dict()
    json.dumps(d)
    assert d["chips"] == 1024 and d["slices"] == 4 and d["chips_per_slice"] == 256
    assert d["hosts"] == 4 * 256 // s.chip.chips_per_host
    assert d["dcn_slice_bytes_per_s"] == pytest.approx(256 * s.chip.dcn_bytes_per_s)
    assert s.graph.number_of_nodes() == 256


def test_to_dict_keys() -> None:
    d = build_slice("3d:4x4x8", twisted=True).to_dict()
    for key in ("spec", "chip", "chips", "dims", "wrap", "twisted", "slices", "links", "diameter_hops",
                "bisection_bytes_per_s", "hosts", "default_chip_used"):
        assert key in d
    assert d["twisted"] and d["default_chip_used"] and d["chip"] == "v5p"


def test_big_slice_is_cheap_and_lazy() -> None:
    s = build_slice("3d:16x16x24", "v5p")
    assert s.num_chips == 6144 and s.num_links == 3 * 6144
    assert s.hops((0, 0, 0), (8, 8, 12)) == 28 == s.diameter_hops
    assert s.bisection_links == 2 * 16 * 16
    assert "graph" not in s.__dict__  # nothing above built the networkx graph


# ---- twisted tori ---------------------------------------------------------------------------------

def test_twist_capable_shapes() -> None:
    for dims in [(4, 4, 8), (4, 8, 8), (8, 8, 16), (8, 16, 16), (8, 4, 4), (12, 12, 24)]:
        assert twist_capable(dims)
    for dims in [(4, 4, 4), (8, 8, 8), (16, 16, 16), (16, 16, 24), (2, 2, 4), (4, 4, 12), (4, 4)]:
        assert not twist_capable(dims)


TWISTABLE = sorted(set(itertools.permutations((4, 4, 8))) | set(itertools.permutations((4, 8, 8))))


@pytest.mark.parametrize("dims", TWISTABLE)
def test_twisted_hops_are_graph_distances(dims: tuple[int, ...]) -> None:
    s = build_slice(format_topology(dims), "v5p", twisted=True)
    assert s.twisted and s.num_links == 3 * s.num_chips
    check_against_graph(s, pairs=3)
    assert s.diameter_hops == nx.eccentricity(s.graph, (0, 0, 0)) == 6  # vertex-transitive
    for c in itertools.islice(s.coords(), 0, None, 7):
        for axis in range(3):
            assert s.neighbor(s.neighbor(c, axis, 1), axis, -1) == c


def test_twist_shortens_paths() -> None:
    plain = build_slice("3d:8x8x16", "v5p")
    twisted = build_slice("3d:8x8x16", "v5p", twisted=True)
    assert (plain.diameter_hops, twisted.diameter_hops) == (16, 12)
    assert nx.eccentricity(twisted.graph, (0, 0, 0)) == 12
    assert twisted.bisection_links > plain.bisection_links


# ---- errors ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, match", [
    (dict(spec="3d:4x4x4", chip="v6e"), "2D torus"),
    (dict(spec="2d:32x16", chip="v6e"), "16x16"),
    (dict(spec="3d:16x16x32", chip="v5p"), "16x16x24"),
    (dict(spec="3d:8x8x8", chip="v5p", twisted=True), "cannot be twisted"),
    (dict(spec="3d:4x4x8", chip="v5p", twisted=True, wrap=(True, True, False)), "wraps every axis"),
    (dict(spec="2d:16x16", chip="v6e", twisted=True), "no twisted tori"),
    (dict(spec="2d:4x4", chip="v6e", wrap=(True, True, True)), "one flag per axis"),
    (dict(spec="2d:4x4", chip="v6e", slices=0), "slices"),
    (dict(spec="2d:4x4", chip="no-such-chip"), "unknown chip"),
    (dict(spec="2d:4"), "accepted forms"),
])
def test_build_rejects(kwargs: dict, match: str) -> None:
    with pytest.raises(TpusimError, match=match):
        build_slice(**kwargs)


def test_bad_coordinates_and_ranks() -> None:
    s = build_slice("2d:4x4", "v6e")
    for call in (lambda: s.rank_of((4, 0)), lambda: s.rank_of((0, 0, 0)), lambda: s.coord_of(16),
                 lambda: s.hops((0, 0), (0, 9)), lambda: s.neighbor((0, 0), 2, 1),
                 lambda: s.neighbor((0, 0), 0, 2)):
        with pytest.raises(TpusimError):
            call()
    assert s.neighbor((0, 0), 0, -1) is None  # unwrapped edge


# ---- properties on random small shapes ----------------------------------------------------------

shapes = st.tuples(st.integers(1, 5), st.integers(1, 4), st.integers(1, 3)).filter(
    lambda d: d[0] * d[1] * d[2] <= 40)


@settings(max_examples=40, deadline=None)
@given(shapes, st.tuples(st.booleans(), st.booleans(), st.booleans()))
def test_random_tori_match_graph(dims: tuple[int, int, int], wrap: tuple[bool, bool, bool]) -> None:
    s = build_slice(format_topology(dims), lab3d(), wrap=wrap)
    assert s.wrap == tuple(w and n > 1 for w, n in zip(wrap, dims, strict=True))
    check_against_graph(s)
    g = s.graph
    if nx.is_connected(g):
        assert s.diameter_hops == nx.diameter(g)
    for axis in range(3):  # closed-form cut == links of the graph that cross the halving plane
        half = dims[axis] // 2
        crossing = sum((u[axis] < half) != (v[axis] < half) for u, v in g.edges())
        assert s.cut_links(axis) == crossing


@settings(max_examples=30, deadline=None)
@given(shapes, st.tuples(st.booleans(), st.booleans(), st.booleans()), st.data())
def test_hops_is_a_metric(dims: tuple[int, int, int], wrap: tuple[bool, bool, bool],
                          data: st.DataObject) -> None:
    s = build_slice(format_topology(dims), lab3d(), wrap=wrap)
    rank = st.integers(0, s.num_chips - 1)
    a, b, c = (s.coord_of(data.draw(rank)) for _ in range(3))
    assert s.hops(a, b) == s.hops(b, a)
    assert s.hops(a, a) == 0
    assert s.hops(a, c) <= s.hops(a, b) + s.hops(b, c)
    assert s.hops(a, b) <= s.diameter_hops


def _min_bisection(g: nx.MultiGraph) -> int:
    """Brute force: fewest edges between two equal halves (tiny graphs only)."""
    nodes = list(g.nodes)
    index = {v: i for i, v in enumerate(nodes)}
    edges = [(1 << index[u], 1 << index[v]) for u, v in g.edges()]
    best = len(edges)
    first = 1 << 0  # fix node 0 in one half: each partition counted once
    for rest in itertools.combinations(range(1, len(nodes)), len(nodes) // 2 - 1):
        mask = first | sum(1 << i for i in rest)
        best = min(best, sum(bool(mask & a) != bool(mask & b) for a, b in edges))
    return best


@pytest.mark.parametrize("spec, wrap", [("2d:4x4", (True, True)), ("2d:4x4", (False, False)),
                                        ("2d:2x4", (False, True)), ("3d:2x2x4", (True, True, True)),
                                        ("2d:2x8", (False, False))])
def test_bisection_is_the_true_minimum_on_tiny_slices(spec: str, wrap: tuple[bool, ...]) -> None:
    s = build_slice(spec, lab3d(), wrap=wrap)
    assert s.bisection_links == _min_bisection(s.graph)


# ---- drawing --------------------------------------------------------------------------------------

@pytest.mark.parametrize("spec, kwargs", [("2d:8x16", {}), ("1d:8", {"wrap": (True,)}),
                                          ("3d:4x4x8", {"twisted": True}), ("3d:16x16x24", {})])
def test_draw_slice(tmp_path, spec: str, kwargs: dict) -> None:
    from tpusim.slice.plot import draw_slice

    path = tmp_path / "slice.png"
    assert draw_slice(build_slice(spec, **kwargs), path) == str(path)
    assert path.stat().st_size > 10_000


def test_cube_generations_limit_chips_not_axis_lengths():
    # MLPerf Training v4.0 ran GPT-3 on v5p as one 8x16x48 slice (6144 chips = 96 cubes): the optical
    # switches join cubes in any arrangement, so an axis of 48 is legal while 8192 chips is not.
    s = build_slice("3d:8x16x48", "v5p")
    assert s.num_chips == 6144 and s.wrap == (True, True, True)
