"""Placement (tpusim/placement/): parsing, the default mapping, distinct mappings, remapping and its undo,
the report's distributed section and terminal lines, and that a placement moves collective time the way
the closed form says."""

import pytest

from tpusim.errors import TpusimError
from tpusim.network.collectives import closed_form_time
from tpusim.placement import (
    Mesh,
    apply_placement,
    compare,
    default_placement,
    distributed_info,
    enumerate_placements,
    logical,
    parse_placement,
    remap,
    trace_mesh,
)
from tpusim.pricing import price
from tpusim.report.placements import format_placements
from tpusim.slice.topology import build_slice
from tpusim.trace.records import CollectiveRecord, InexactCollective, RanksOne, StepMarker, Trace, TraceMeta, renumber


def mesh_of(shape, names=("fsdp", "tp")):
    n = 1
    for s in shape:
        n *= s
    return Mesh(tuple(names), tuple(shape), tuple(range(n)))


def test_default_mapping_is_the_identity_numbering():
    s = build_slice("3d:8x8x8")
    p = default_placement(mesh_of((64, 8)), s)
    assert p.text(s) == "tp=x,fsdp=yz"
    assert p.physical(s) == {r: r for r in range(512)}


def test_parse_places_dims_on_the_named_axes():
    s = build_slice("3d:8x8x8")
    p = parse_placement("tp=y,fsdp=xz", mesh_of((64, 8)), s)
    phys = p.physical(s)
    tp_group = [phys[r] for r in range(8)]               # logical tp group of rank 0
    assert [s.coord_of(r) for r in tp_group] == [(0, y, 0) for y in range(8)]
    assert p.text(s) == "tp=y,fsdp=xz"


def test_partial_axes_with_counts():
    s = build_slice("3d:8x8x8")
    p = parse_placement("tp=x4,fsdp=x2yz", mesh_of((128, 4)), s)
    assert p.physical(s) == {r: r for r in range(512)}  # the default numbering, spelled out
    assert p.text(s) == "tp=x4,fsdp=x2yz"


@pytest.mark.parametrize("text, message", [
    ("tp=x", "does not place mesh dim"),
    ("tp=q,fsdp=yz", "is not DIM=AXES"),
    ("pp=x,fsdp=yz", "not a dim of the DeviceMesh"),
    ("tp=xy,fsdp=z", "8x short of chips"),
    ("tp=x3,fsdp=yz", "does not fit"),
])
def test_bad_placements_say_what_is_accepted(text, message):
    with pytest.raises(TpusimError, match=message):
        parse_placement(text, mesh_of((64, 8)), build_slice("3d:8x8x8"))


def test_distinct_placements_up_to_symmetry():
    cube = [p.text(build_slice("3d:8x8x8")) for p in enumerate_placements(mesh_of((64, 8)), build_slice("3d:8x8x8"))]
    assert cube[0] == "tp=x,fsdp=yz" and len(cube) == 3   # one axis / two axes / three axes for tp
    s = build_slice("3d:2x4x8")
    texts = {p.text(s) for p in enumerate_placements(mesh_of((8, 8)), s)}
    assert {"tp=xy,fsdp=z", "tp=z,fsdp=xy"} <= texts


def _trace(world, shape, tp_bytes, fsdp_bytes):
    tp = tuple(range(shape[1]))
    fsdp = tuple(range(0, world, shape[1]))
    records = []
    for step in range(2):
        records += [CollectiveRecord(0, "all_reduce", tp_bytes, tp, mesh_axis="tp"),
                    CollectiveRecord(0, "all_gather", fsdp_bytes, fsdp, mesh_axis="fsdp"),
                    StepMarker(0, step + 1)]
    meta = TraceMeta(meshes=(Mesh(("fsdp", "tp"), tuple(shape), tuple(range(world))),))
    return Trace(renumber(records), world_size=world, meta=meta)


def _tp_time(trace, s, text):
    mapped = remap(trace, s, parse_placement(text, trace_mesh(trace), s))
    timeline = price(mapped, topology=s)
    return sum(c.end_s - c.start_s for c in timeline.collectives if c.kind == "all_reduce")


def test_placement_moves_collective_time_the_way_the_closed_form_predicts():
    s = build_slice("3d:2x4x8")                          # no wraparound: lines of 2, 4 and 8 chips
    nbytes = 8 << 20
    trace = _trace(64, (8, 8), nbytes, 1 << 20)
    on_z, on_xy = _tp_time(trace, s, "tp=z,fsdp=xy"), _tp_time(trace, s, "tp=xy,fsdp=z")
    cf_z = closed_form_time(s, "all_reduce", nbytes, axes=("z",))
    cf_xy = closed_form_time(s, "all_reduce", nbytes, axes=("x", "y"))
    assert cf_z != pytest.approx(cf_xy, rel=0.05)
    assert (on_z < on_xy) == (cf_z < cf_xy)
    assert on_z == pytest.approx(2 * cf_z, rel=0.02) and on_xy == pytest.approx(2 * cf_xy, rel=0.02)


def test_compare_ranks_placements_and_explains_the_winner():
    s = build_slice("3d:4x4x8")
    result = compare(_trace(128, (8, 16), 16 << 20, 4 << 20), s, lambda t, sl: price(t, topology=sl))
    ranked = result.ranked
    assert len(ranked) >= 3 and ranked[0].step_s <= ranked[-1].step_s
    assert result.default == "tp=xy,fsdp=z" and result.mesh.dim_names == ("fsdp", "tp")   # tp=16: x then y
    assert result.reason.startswith(ranked[0].placement + " wins")
    assert "tp" in result.reason or "fsdp" in result.reason
    lines = format_placements(None, result).splitlines()
    assert lines[0] == "placements (ranked by step time):" and lines[1].startswith(f"  1. {ranked[0].placement} ")


def test_compare_without_a_mesh_says_why():
    s = build_slice("3d:2x2x2")
    result = compare(Trace(renumber([StepMarker(0, 1)]), world_size=8), s, lambda t, sl: price(t, topology=sl))
    assert result.mesh is None and result.ranked == () and "no DeviceMesh" in result.reason
    assert format_placements(None, result) == f"placements: {result.reason}\n"


def test_placement_is_noted_in_the_meta_and_undone_for_comparison():
    s = build_slice("3d:2x4x8")
    trace = _trace(64, (8, 8), 1 << 20, 1 << 20)
    mapped = apply_placement(trace, s, "tp=z,fsdp=xy")
    assert mapped.meta.placement == "tp=z,fsdp=xy" and mapped.meta.meshes == trace.meta.meshes
    assert mapped.records != trace.records                   # collective groups now physical
    assert logical(mapped, s) == trace                       # and back
    assert apply_placement(trace, s, None) is trace
    with pytest.raises(TpusimError, match="needs a DeviceMesh"):
        apply_placement(Trace(trace.records, world_size=64), s, "tp=z,fsdp=xy")


def test_distributed_section_and_the_ranks_one_caveat():
    s = build_slice("3d:2x4x8")
    trace = _trace(64, (8, 8), 1 << 20, 1 << 20)
    assert distributed_info(trace, s) is None                # no --ranks: not a tpusim run recording
    inexact = InexactCollective("all_gather", "model.py:7", 2, "exact only if every rank's shard is equal")
    one = Trace(trace.records, world_size=64,
                meta=trace.meta.replace(ranks="one", ranks_one=RanksOne("symmetry", (inexact,))))
    info = distributed_info(one, s)
    assert (info.ranks, info.world_size, info.placement, info.numerics_rule) == ("one", 64, "tp=xy,fsdp=z", "symmetry")
    assert info.not_reference_correct == (inexact,)
    assert format_placements(info, None).startswith("--ranks one: values after all_gather follow the symmetry rule")
    every = distributed_info(Trace(trace.records, world_size=64, meta=trace.meta.replace(ranks="all")), s)
    assert every.numerics_rule == "exact (every rank ran)" and every.not_reference_correct == ()
    assert format_placements(every, None) == ""
