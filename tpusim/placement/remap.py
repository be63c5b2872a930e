"""A placement applied to a trace: collective groups (and, for a multi-rank trace, record ranks) renumbered
from logical to physical ranks, with the placement noted in ``TraceMeta.placement``; and undone."""

from __future__ import annotations

import dataclasses

from tpusim.errors import TpusimError
from tpusim.placement.mesh import Placement, trace_mesh
from tpusim.placement.parse import parse_placement
from tpusim.slice.topology import Slice
from tpusim.trace.records import CollectiveRecord, Trace, TraceMeta


def remap(trace: Trace, slice_: Slice, placement: Placement) -> Trace:
    """The trace with every collective group (and, for multi-rank traces, every rank) made physical."""
    return _renumber_ranks(trace, placement.physical(slice_), trace.meta.replace(placement=placement.text(slice_)))


def apply_placement(trace: Trace, slice_: Slice, text: str | None) -> Trace:
    """``--placement``: the trace remapped onto the named axes (unchanged without a flag or a mesh)."""
    if not text:
        return trace
    mesh = trace_mesh(trace)
    if mesh is None:
        raise TpusimError("--placement needs a DeviceMesh covering every rank (init_device_mesh('tpu', ...)); "
                          "this script recorded none")
    return remap(trace, slice_, parse_placement(text, mesh, slice_))


def logical(trace: Trace, slice_: Slice) -> Trace:
    """Undo --placement (comparisons start from logical ranks): the default placement is the identity."""
    text = trace.meta.placement
    mesh = trace_mesh(trace)
    if not text or mesh is None:
        return trace
    phys = parse_placement(text, mesh, slice_).physical(slice_)
    back = {p: rank for rank, p in phys.items()}
    return _renumber_ranks(trace, back, trace.meta.replace(placement=None))


def _renumber_ranks(trace: Trace, ranks: dict[int, int], meta: TraceMeta) -> Trace:
    """``trace`` with collective groups (and, for multi-rank traces, record ranks) mapped through ``ranks``."""
    multi = len({r.rank for r in trace.records}) > 1
    records = []
    for r in trace.records:
        if isinstance(r, CollectiveRecord) and r.group:
            r = dataclasses.replace(r, group=tuple(ranks[g] for g in r.group))
        if multi:
            r = dataclasses.replace(r, rank=ranks[r.rank])
        records.append(r)
    return dataclasses.replace(trace, records=tuple(records), meta=meta)
