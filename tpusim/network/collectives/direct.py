"""``direct`` (one-shot): every rank sends straight to every rank that needs its data, all at once.

One step, so its latency is the longest route (not a ring's n-1 or n/2 steps): the cheapest
algorithm for small, latency-bound messages, and the only one for ``permute``. All-reduce is
one-shot (everyone sends the whole buffer to everyone and reduces locally). Routes share
channels, so for large messages it loses to the rings. Groups above ``DIRECT_MAX_RANKS`` are
not offered (n^2 flows); permute (n flows) has no limit. Permute sends each rank's data to the
next rank along the group's first axis (cyclic), or the next in an irregular group's order.
"""

from __future__ import annotations

from tpusim.network.collectives import closed_form as cf
from tpusim.network.collectives import patterns
from tpusim.network.collectives.common import axis_params, phase
from tpusim.network.collectives.groups import (
    Node,
    Request,
    group_snake,
    lines_for,
    lines_per_axis,
    node_path,
    ring_line,
)
from tpusim.network.collectives.plan import CollectiveCost, CollectivePlan

DIRECT_MAX_RANKS = 64


def supports(req: Request) -> str | None:
    spans_slices = req.has_dcn or (req.ranks is not None and len({s for s, _ in req.ranks}) > 1)
    if spans_slices and req.kind != "permute":
        return "the group spans slices: use dcn (one-shot all-to-all crossing DCN NICs is what its DCN stage does)"
    if req.kind != "permute" and req.group_size > DIRECT_MAX_RANKS:
        return f"one-shot is offered up to {DIRECT_MAX_RANKS} ranks (n^2 flows); this group has {req.group_size}"
    return None


def _members(req: Request) -> list[Node]:
    return list(req.ranks) if req.ranks is not None else group_snake(req)


def plan(req: Request) -> CollectivePlan:
    s = req.slice
    if req.kind == "permute":
        if req.ranks is not None:
            return CollectivePlan((phase(patterns.shift(ring_line(s, req.ranks), req.nbytes)),),
                        "shift by one along the group's order")
        a = req.axes[0]
        copies = lines_per_axis(req, a)
        lines = lines_for(req, a, req.axes[1:])
        return CollectivePlan((phase([s for line in lines for s in patterns.shift(line, req.nbytes)]),),
                    f"shift by one along {req.axis_label(a)}; "
                    + (f"all {copies} lines" if req.slice.faults else f"1 representative line (of {copies})"))
    nodes = _members(req)
    n = len(nodes)
    root = req.root
    flows = []
    if req.kind in ("broadcast", "reduce"):
        for b in nodes:
            if b != root:
                flows.append((node_path(s, root, b) if req.kind == "broadcast" else node_path(s, b, root),
                              req.nbytes))
    else:
        size = req.nbytes if req.kind == "all_reduce" else req.nbytes / n
        for a in nodes:
            for b in nodes:
                if a != b:
                    flows.append((node_path(s, a, b), size))
    chip = s.chip
    floor = chip.ici_link_bytes_per_s * chip.ici_hop_latency_ns * 1e-9 / 8
    return CollectivePlan((phase(patterns.direct(flows, 1, floor)),), f"all {len(flows)} flows of the group")


def cost(req: Request) -> CollectiveCost | None:
    if req.ranks is not None or req.slice.twisted or req.slice.faults:
        return None
    if req.kind == "permute":
        return cf.shift(axis_params(req, req.axes[0]), req.nbytes)
    axes = sorted(req.axes)  # dimension-order routing goes x, then y, then z
    params = [axis_params(req, a) for a in axes]
    roots = [req.position(a) for a in axes]
    n = req.group_size
    if req.kind == "broadcast":
        return cf.direct(params, req.nbytes, "from_root", roots)
    if req.kind == "reduce":
        return cf.direct(params, req.nbytes, "to_root", roots)
    size = req.nbytes if req.kind == "all_reduce" else req.nbytes / n
    return cf.direct(params, size, "pairs", roots)
