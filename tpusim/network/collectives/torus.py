"""Multi-axis algorithms on a torus: ``hierarchical`` and ``multi_axis``.

- ``hierarchical`` (dimension-ordered): reduce-scatter along each axis in turn (the data shrinks
  by that axis's length each time), then all-gather in reverse order; broadcast/reduce and
  all-to-all go axis by axis. Each axis step is a bidirectional ring (or line pipelines).
  Sequential phases, so its bandwidth term is that of one axis: ~2V/W2 for all-reduce.
- ``multi_axis`` (concurrent): the data is split into k parts over the k axes; part j visits the
  axes in the order rotated by j, so in every phase each axis carries a different part and all
  axes' links are busy at once: the scaling book's V/(k W2) (all-reduce 2V/(k W2)).
  A phase ends when every part has finished it (a barrier); with equal axes the parts are in
  lockstep and the barrier costs nothing.

Both are built from one *schedule* (which axis, which primitive, how many bytes, per phase and
part); the DES plays it on the line through the group's first rank of each axis, and the closed
form adds the primitives' formulas over the same schedule. On a faulted slice every line of a
stage is built (``Stage.over`` says through which positions) and the plan is priced by
``plan.estimate`` (groups.py, "Faults").
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from tpusim.network.collectives.common import axis_params, line_cost, line_phases
from tpusim.network.collectives.groups import Request, lines_for
from tpusim.network.collectives.plan import CollectiveCost, CollectivePlan, Phase, slowest

VARIANT = "bidi"


@dataclass(frozen=True)
class Stage:
    axis: int
    kind: str         # all_gather, reduce_scatter, all_to_all, broadcast, reduce
    data: float
    copies: int       # lines along ``axis`` working in this stage (translates)
    over: tuple[int, ...] = ()   # the axes whose positions those lines pass through (copies = their sizes)


def supports_hierarchical(req: Request) -> str | None:
    if req.ranks is not None:
        return "the group is not a product of axis lines"
    if req.has_dcn:
        return "the group spans slices over DCN: use dcn"
    if req.kind == "permute":
        return "permute is point to point: use direct"
    return None


def supports_multi_axis(req: Request) -> str | None:
    why = supports_hierarchical(req)
    if why is None and len(req.axes) < 2:
        return "needs at least two torus axes"
    return why


def part_stages(req: Request, order: tuple[int, ...], data: float) -> list[Stage]:
    """One part's stages along ``order`` (see the module docstring)."""
    sizes = [req.size(a) for a in order]
    every = req.group_size
    shrink = [data]
    for n in sizes[:-1]:
        shrink.append(shrink[-1] / n)
    reached = [math.prod(sizes[:i]) for i in range(len(order))]
    kind = req.kind

    def others(a: int) -> tuple[int, ...]:
        return tuple(b for b in order if b != a)

    if kind == "reduce_scatter":
        return [Stage(a, kind, shrink[i], every // sizes[i], others(a)) for i, a in enumerate(order)]
    if kind == "all_gather":
        return [Stage(a, kind, shrink[i], every // sizes[i], others(a))
                for i, a in reversed(list(enumerate(order)))]
    if kind == "all_reduce":
        return (part_stages(_as(req, "reduce_scatter"), order, data)
                + part_stages(_as(req, "all_gather"), order, data))
    if kind == "all_to_all":
        return [Stage(a, kind, data, every // sizes[i], others(a)) for i, a in enumerate(order)]
    if kind == "broadcast":
        return [Stage(a, kind, data, reached[i], order[:i]) for i, a in enumerate(order)]
    if kind == "reduce":
        return [Stage(a, kind, data, reached[i], order[:i]) for i, a in reversed(list(enumerate(order)))]
    raise AssertionError(kind)


def _as(req: Request, kind: str) -> Request:
    return dataclasses.replace(req, kind=kind)


def schedule(req: Request, concurrent: bool) -> list[list[Stage]]:
    """Phases, each a list of stages that run at once (one per part)."""
    axes = req.axes
    if not concurrent:
        return [[s] for s in part_stages(req, axes, req.nbytes)]
    k = len(axes)
    parts = [part_stages(req, axes[j:] + axes[:j], req.nbytes / k) for j in range(k)]
    return [list(p) for p in zip(*parts, strict=True)]


def _plan(req: Request, concurrent: bool) -> CollectivePlan:
    phases = []
    for stages in schedule(req, concurrent):
        streams = []
        for st in stages:
            for line in lines_for(req, st.axis, st.over):
                for ph in line_phases(st.kind, line, st.data, VARIANT, req.position(st.axis)):
                    streams.extend(ph.streams)
        phases.append(Phase(tuple(streams)))
    labels = ",".join(req.axis_labels)
    note = (f"every line of each axis ({labels})" if req.slice.faults else
            f"1 representative line per axis ({labels}) through the group's first rank")
    return CollectivePlan(tuple(phases), note)


def _cost(req: Request, concurrent: bool) -> CollectiveCost | None:
    if req.slice.twisted or req.slice.faults:
        return None
    total = CollectiveCost()
    for stages in schedule(req, concurrent):
        total = total + slowest([line_cost(st.kind, axis_params(req, st.axis), st.data, VARIANT,
                                           req.position(st.axis)) for st in stages])
    return total


def hierarchical_plan(req: Request) -> CollectivePlan:
    return _plan(req, False)


def hierarchical_cost(req: Request) -> CollectiveCost | None:
    return _cost(req, False)


def multi_axis_plan(req: Request) -> CollectivePlan:
    return _plan(req, True)


def multi_axis_cost(req: Request) -> CollectiveCost | None:
    return _cost(req, True)
