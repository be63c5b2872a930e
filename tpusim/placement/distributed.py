"""What a run's report says about distribution (its ``distributed`` section): --ranks one or all, the
placement in effect, and which --ranks one collectives follow the symmetry rule instead of the reference."""

from __future__ import annotations

from dataclasses import dataclass

from tpusim.placement.mesh import default_placement, trace_mesh
from tpusim.slice.topology import Slice
from tpusim.trace.records import InexactCollective, Trace

EXACT = "exact (every rank ran)"
NO_VALUES = "no values computed (--numerics off): shapes, dtypes and every priced byte are exact"


@dataclass(frozen=True)
class Distributed:
    ranks: str                         # "one" | "all"
    world_size: int
    placement: str                     # "tp=x,fsdp=yz"; "" without a DeviceMesh covering the slice
    numerics_rule: str                 # --ranks one: the symmetry rule; --ranks all: EXACT
    not_reference_correct: tuple[InexactCollective, ...]   # --ranks one: the collectives it made inexact


def distributed_info(trace: Trace, slice_: Slice) -> Distributed | None:
    """The section for a trace that says how its ranks ran (``TraceMeta.ranks``); None otherwise."""
    meta = trace.meta
    if not meta.ranks:
        return None
    one = meta.ranks_one if meta.ranks == "one" else None
    rule = (one.rule if one else "") if meta.ranks == "one" else EXACT
    if meta.numerics is False:              # shape-only: no value exists to be reference-correct or not
        one, rule = None, NO_VALUES
    return Distributed(ranks=meta.ranks, world_size=trace.world_size,
                       placement=meta.placement or _default_text(trace, slice_),
                       numerics_rule=rule, not_reference_correct=one.not_reference_correct if one else ())


def _default_text(trace: Trace, slice_: Slice) -> str:
    mesh = trace_mesh(trace)
    if mesh is None or mesh.size != slice_.num_chips or slice_.num_slices > 1:
        return ""
    return default_placement(mesh, slice_).text(slice_)
