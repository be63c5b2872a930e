"""``dcn``: a collective over several slices (multislice): ICI stages inside every slice around
one DCN stage between slices, so the slow DCN carries as little as possible.

- all_reduce:      ICI reduce-scatter (V), DCN all-reduce of the V/N shard, ICI all-gather (V)
- all_gather:      DCN all-gather of the V/N shard first, then ICI all-gather (V)
- reduce_scatter:  ICI reduce-scatter (V), then DCN reduce-scatter of the V/N shard
- all_to_all:      ICI all-to-all (B), then DCN one-shot exchange (B/S to each other slice)
- broadcast:       ICI broadcast in the root's slice (V), DCN chains of the V/N shards from
                   every chip of that slice (all NICs at once), ICI all-gather in the others
- reduce:          ICI reduce-scatter (V), DCN chains of the V/N shards into the root's slice,
                   ICI gather to the root there (priced as an all-gather: the same
                   bandwidth term on the root's 2k links)
- permute:         along the group's first axis: DCN (next slice) or ICI

N = chips of the group inside one slice, S = slices. The DCN stage is a ring over the slices
(each chip's one egress and one ingress channel at ``dcn_bytes_per_s``, ``dcn_latency_ns`` per
crossing): ring steps (S-1)(dcn_latency + shard/W_dcn), a bidirectional ring would gain nothing
as both directions leave through the same NIC. The ICI stages use the cheapest ICI algorithm
for their size (closed form). All slices and chip positions are translates: the DES runs the
ICI stages in the root's slice and the DCN stage for the root's chip position.
"""

from __future__ import annotations

from dataclasses import replace

from tpusim.collectives import patterns
from tpusim.collectives.common import axis_params, line_cost, line_phases, phase
from tpusim.collectives.groups import Request, axis_line
from tpusim.collectives.plan import Cost, Phase, Plan

# (where, kind, which slices run it: "all", "root" slice only, "others") per collective
STAGES = {
    "all_reduce": (("ici", "reduce_scatter", "all"), ("dcn", "all_reduce", "all"),
                   ("ici", "all_gather", "all")),
    "all_gather": (("dcn", "all_gather", "all"), ("ici", "all_gather", "all")),
    "reduce_scatter": (("ici", "reduce_scatter", "all"), ("dcn", "reduce_scatter", "all")),
    "all_to_all": (("ici", "all_to_all", "all"), ("dcn", "all_to_all", "all")),
    "broadcast": (("ici", "broadcast", "root"), ("dcn", "broadcast", "all"), ("ici", "all_gather", "others")),
    "reduce": (("ici", "reduce_scatter", "all"), ("dcn", "reduce", "all"), ("ici", "all_gather", "root")),
}
SHARDED = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")


def supports(req: Request) -> str | None:
    if not req.has_dcn:
        return "the group does not span slices (no dcn axis)"
    return None


def _stages(req: Request) -> list[tuple[str, Request, int]]:
    """(where, sub-request, copies) per stage: DCN carries V/N shards where the ICI stages reduce
    or gather; ``copies`` counts the slices (ICI) or chip positions (DCN) running the stage."""
    ici_axes = req.ici_axes
    slices = req.slice.num_slices
    n_ici = req.group_size // slices
    if req.kind == "permute":
        where = "dcn" if req.axes[0] == req.dcn_axis else "ici"
        stages: tuple = ((where, "permute", "all"),)
    else:
        stages = STAGES[req.kind]
    out = []
    for where, kind, who in stages:
        if where == "ici":
            if ici_axes:
                copies = {"all": slices, "root": 1, "others": slices - 1}[who]
                out.append(("ici", Request(req.slice, kind, req.nbytes, ici_axes, req.root, None, n_ici), copies))
            continue
        data = req.nbytes / n_ici if req.kind in SHARDED else req.nbytes
        out.append(("dcn", Request(req.slice, kind, data, (req.dcn_axis,), req.root, None, slices), n_ici))
    return out


def _dcn_plan(req: Request, sub: Request, copies: int) -> list[Phase]:
    line = axis_line(req.slice, req.dcn_axis, req.root, copies)
    if sub.kind == "all_to_all":
        s = line.n
        flows = [(line.path(i, j), sub.nbytes / s) for i in range(s) for j in range(s) if i != j]
        chip = req.slice.chip
        floor = chip.dcn_bytes_per_s * chip.dcn_latency_ns * 1e-9 / 8
        return [phase(patterns.direct(flows, line.copies, floor, pieces=64))]  # few flows: chunk finely
    return line_phases(sub.kind, line, sub.nbytes, "uni", 0)


def _dcn_cost(req: Request, sub: Request) -> Cost:
    ax = axis_params(req, req.dcn_axis)
    if sub.kind == "all_to_all":  # each chip's NIC sends (S-1) pieces of B/S, one crossing
        return Cost(ax.lat, (ax.n - 1) * sub.nbytes / ax.n / ax.bw)
    return line_cost(sub.kind, ax, sub.nbytes, "uni", 0)


def plan(req: Request) -> Plan:
    from tpusim.collectives import best_ici_algorithm, build_plan

    phases: list[Phase] = []
    notes = []
    for where, sub, copies in _stages(req):
        if where == "dcn":
            phases.extend(_dcn_plan(req, sub, copies))
            continue
        name = best_ici_algorithm(sub)
        inner = build_plan(sub, name)
        notes.append(f"ICI {sub.kind} by {name}")
        for ph in inner.phases:  # the slices running it are translates: the root's stands for all
            phases.append(Phase(tuple(replace(s, copies=s.copies * copies) for s in ph.streams)))
    notes.append("DCN stage on the root's chip position")
    return Plan(tuple(phases), "; ".join(notes))


def cost(req: Request) -> Cost:
    from tpusim.collectives import algorithm_cost, best_ici_algorithm

    total = Cost()
    for where, sub, _copies in _stages(req):
        if where == "dcn":
            total = total + _dcn_cost(req, sub)
        else:
            total = total + algorithm_cost(sub, best_ici_algorithm(sub))
    return total
