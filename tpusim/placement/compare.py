"""Every distinct placement priced and ranked by step time, and why the best one wins
(``--compare-placements``; the report's ``placements`` section as a ``PlacementComparison``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tpusim.placement.mesh import Mesh, Placement, trace_mesh
from tpusim.placement.remap import logical, remap
from tpusim.placement.search import MAX_PLACEMENTS, enumerate_placements
from tpusim.placement.text import describe_segments, fmt_seconds
from tpusim.pricing.timeline import Timeline, step_stats
from tpusim.slice.topology import Slice
from tpusim.trace.records import CollectiveRecord, Trace

Simulate = Callable[[Trace, Slice], Timeline]   # a trace on a slice -> its priced Timeline


@dataclass(frozen=True)
class PricedPlacement:
    """One placement's price: step time (``tpusim.pricing.timeline.step_stats``) and its collectives per mesh dim."""

    placement: str                     # "tp=x,fsdp=yz"
    total_s: float
    step_s: float
    collective_s: float
    by_dim: dict[str, float]           # mesh dim -> summed collective time (busiest simulated chip)
    axes: dict[str, str]               # mesh dim -> how its chips sit on the torus
    algorithms: dict[str, str]         # mesh dim -> algorithm of its largest collective


@dataclass(frozen=True)
class PlacementComparison:
    """The ranking: ``mesh`` None when no recorded DeviceMesh covers the world (``reason`` says so)."""

    mesh: Mesh | None
    default: str | None                # the default placement's text
    ranked: tuple[PricedPlacement, ...]   # by step time, then collective time
    reason: str                        # why the best wins


def price_placement(trace: Trace, slice_: Slice, placement: Placement, simulate: Simulate) -> PricedPlacement:
    """Price ``trace`` under ``placement`` with ``simulate(trace, slice_) -> Timeline``."""
    timeline = simulate(remap(trace, slice_, placement), slice_)
    step_s = step_stats([s.seconds for s in timeline.steps], timeline.total_s).median_s
    axis_of = {c.seq: c.mesh_axis for c in trace.of_kind(CollectiveRecord)}
    per_chip: dict[int, dict[str, float]] = {}
    biggest: dict[str, tuple[float, str]] = {}
    for run in timeline.collectives:
        dim = axis_of.get(run.seq, "") or "world"
        t = run.end_s - run.start_s
        chip = per_chip.setdefault(run.chip, {})
        chip[dim] = chip.get(dim, 0.0) + t
        if t >= biggest.get(dim, (-1.0, ""))[0]:
            biggest[dim] = (t, run.result.algorithm)
    by_dim = max(per_chip.values(), key=lambda d: sum(d.values()), default={})
    axes = {n: describe_segments(s, slice_) for n, s in zip(placement.mesh.dim_names, placement.dims)}
    return PricedPlacement(placement.text(slice_), timeline.total_s, step_s, sum(by_dim.values()), by_dim, axes,
                           {d: a for d, (_, a) in biggest.items()})


def compare(trace: Trace, slice_: Slice, simulate: Simulate, limit: int = MAX_PLACEMENTS) -> PlacementComparison:
    """Every distinct placement of the trace's mesh (from its logical ranks, whatever --placement it was
    recorded under) ranked by step time, with the reason the best wins."""
    trace = logical(trace, slice_)
    mesh = trace_mesh(trace)
    if mesh is None:
        return PlacementComparison(None, None, (), "no DeviceMesh covering the whole world was recorded: "
                                                   "placement only moves DeviceMesh dims")
    priced = [price_placement(trace, slice_, p, simulate) for p in enumerate_placements(mesh, slice_, limit)]
    ranked = tuple(sorted(priced, key=lambda p: (p.step_s, p.collective_s, p.placement)))
    return PlacementComparison(mesh, priced[0].placement, ranked, why_best(ranked))


def why_best(ranked: tuple[PricedPlacement, ...] | list[PricedPlacement]) -> str:
    """The best placement against the runner-up: the mesh dim whose collectives differ most, and why."""
    if len(ranked) < 2:
        return "only one distinct placement: every mapping of this mesh is equivalent on this torus"
    best, other = ranked[0], ranked[1]
    if other.step_s <= best.step_s * (1 + 1e-9) and other.collective_s <= best.collective_s * (1 + 1e-9):
        return f"{best.placement} and {other.placement} tie (the torus is symmetric for this mesh)"
    dims = set(best.by_dim) | set(other.by_dim)
    dim = max(dims, key=lambda d: other.by_dim.get(d, 0.0) - best.by_dim.get(d, 0.0))
    gain = other.by_dim.get(dim, 0.0) - best.by_dim.get(dim, 0.0)
    return (f"{best.placement} wins ({fmt_seconds(best.step_s)} per step vs {fmt_seconds(other.step_s)} for "
            f"{other.placement}): its {dim} collectives take {fmt_seconds(best.by_dim.get(dim, 0.0))} instead of "
            f"{fmt_seconds(other.by_dim.get(dim, 0.0))} ({fmt_seconds(gain)} less) because {dim} runs on "
            f"{best.axes.get(dim, '?')} with {best.algorithms.get(dim, '?')} instead of "
            f"{other.axes.get(dim, '?')} with {other.algorithms.get(dim, '?')}")
