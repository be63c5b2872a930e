"""Ring algorithms: ``ring`` (one direction) and ``bidi_ring`` (both directions at once).

On one torus axis the ring is the axis itself (a line when it does not wrap: the folded ring
for ``ring``, pipelines up and down for ``bidi_ring``), or the group's segment of it (a line, or
a ring of ``stride``-hop edges; groups.py), simulated on the one line through the group's first
rank. Over several axes the ring snakes through the group (boustrophedon order,
one-hop edges but the closing one); for an irregular rank group it visits the ranks in the
order given, each edge routed. Those two cases are priced by ``plan.estimate``.
"""

from __future__ import annotations

from tpusim.network.collectives.common import axis_params, line_cost, line_phases
from tpusim.network.collectives.groups import Request, group_snake, line_of, lines_per_axis, ring_line
from tpusim.network.collectives.plan import CollectiveCost, CollectivePlan


def supports(req: Request) -> str | None:
    if req.kind == "permute":
        return "permute is point to point: use direct"
    if req.has_dcn:
        return "the group spans slices over DCN: use dcn"
    return None


def _line(req: Request):
    if req.ranks is not None:
        return ring_line(req.slice, req.ranks), "a logical ring over the group's ranks in order"
    if len(req.axes) == 1:
        a = req.axes[0]
        copies = lines_per_axis(req, a)
        note = f"1 representative {req.axis_label(a)}-ring (of {copies} identical)" if copies > 1 else ""
        return line_of(req, a, copies), note
    return (ring_line(req.slice, group_snake(req)),
            f"one ring snaking over axes {','.join(req.axis_labels)}")


def _plan(req: Request, variant: str) -> CollectivePlan:
    line, note = _line(req)
    root = 0 if req.ranks is not None or len(req.axes) > 1 else req.position(req.axes[0])
    return CollectivePlan(tuple(line_phases(req.kind, line, req.nbytes, variant, root)), note)


def _cost(req: Request, variant: str) -> CollectiveCost | None:
    if req.ranks is not None or len(req.axes) != 1 or req.slice.twisted or req.slice.faults:
        return None  # priced from the plan (plan.estimate)
    a = req.axes[0]
    return line_cost(req.kind, axis_params(req, a), req.nbytes, variant, req.position(a))


def ring_plan(req: Request) -> CollectivePlan:
    return _plan(req, "uni")


def ring_cost(req: Request) -> CollectiveCost | None:
    return _cost(req, "uni")


def bidi_plan(req: Request) -> CollectivePlan:
    return _plan(req, "bidi")


def bidi_cost(req: Request) -> CollectiveCost | None:
    return _cost(req, "bidi")
