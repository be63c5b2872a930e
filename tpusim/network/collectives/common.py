"""Small shared pieces of the algorithm modules: phases from patterns, axes as the formulas see them."""

from __future__ import annotations

from tpusim.network.collectives import patterns
from tpusim.network.collectives.closed_form import Axis
from tpusim.network.collectives.groups import Line, Request, interleaved_offsets
from tpusim.network.collectives.plan import CollectiveCost, Phase, TransferStream

COMMUNICATING = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast", "reduce")


def phase(streams: list[TransferStream]) -> Phase:
    return Phase(tuple(streams))


def axis_params(req: Request, axis: int) -> Axis:
    """An axis for the closed forms: DCN is a ring over the slices at the DCN rate and latency.

    A segment of ``stride`` is a line or ring of ``size`` ranks whose edges are ``stride`` hops:
    the formulas hold with d -> stride x d (cut-through: an h-hop edge costs h d + bytes / W).
    With SPMD translates interleaved on its channels (``interleaved_offsets``), k groups share
    every link (``Axis.share``; closed_form.step says what a step then costs).
    """
    chip = req.slice.chip
    if axis == req.dcn_axis:
        return Axis(req.slice.num_slices, True, chip.dcn_bytes_per_s, chip.dcn_latency_ns * 1e-9)
    seg = req.segment(axis)
    hop = chip.ici_hop_latency_ns * 1e-9
    return Axis(seg.size, seg.cyclic and seg.size > 1, chip.ici_link_bytes_per_s, hop * seg.stride,
                1 + len(interleaved_offsets(req, axis)), hop)


def line_phases(kind: str, line: Line, nbytes: float, variant: str, root: int) -> list[Phase]:
    """The phases of one collective on one line (all-reduce = reduce-scatter then all-gather)."""
    if kind == "all_reduce":
        return [phase(patterns.ag_rs(line, nbytes, variant, True)),
                phase(patterns.ag_rs(line, nbytes, variant, False))]
    if kind in ("all_gather", "reduce_scatter"):
        return [phase(patterns.ag_rs(line, nbytes, variant, kind == "reduce_scatter"))]
    if kind == "all_to_all":
        return [phase(patterns.all_to_all(line, nbytes, variant))]
    if kind in ("broadcast", "reduce"):
        return [phase(patterns.chains(line, root, nbytes, variant, kind == "reduce"))]
    if kind == "permute":
        return [phase(patterns.shift(line, nbytes))]
    raise AssertionError(kind)


def line_cost(kind: str, ax: Axis, nbytes: float, variant: str, root: int) -> CollectiveCost:
    """Closed form of ``line_phases`` (see closed_form.py for each derivation)."""
    from tpusim.network.collectives import closed_form as cf

    if kind == "all_reduce":
        return cf.all_reduce(ax, nbytes, variant)
    if kind in ("all_gather", "reduce_scatter"):
        return cf.ag_rs(ax, nbytes, variant)
    if kind == "all_to_all":
        return cf.all_to_all(ax, nbytes, variant)
    if kind in ("broadcast", "reduce"):
        return cf.chain(ax, nbytes, variant, root)
    if kind == "permute":
        return cf.shift(ax, nbytes)
    raise AssertionError(kind)
