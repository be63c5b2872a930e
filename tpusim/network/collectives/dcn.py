"""``dcn``: a collective over several slices (multislice): ICI stages inside every slice around
one DCN stage between slices, so the slow DCN carries as little as possible (hierarchical data
parallelism: reduce-scatter on ICI, all-reduce of the shard across slices, all-gather on ICI).

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

N = chips of the group inside one slice, S = slices. The ICI stages use the cheapest ICI
algorithm for their size (closed form).

**Host NICs.** A chip reaches DCN through its host's NICs (``topologies/dcn.toml``: NICs per host,
the block of chips one host holds). The chips of a host that run a DCN stage at once share them:
each sending chip gets ``min(PCIe, NIC x min(1, NICs / senders))``, where the per-NIC rate is
the chip file's per-chip DCN figure x chips per host / NICs (so a calibrated ``dcn_efficiency``
carries over). In an SPMD program every chip position runs its translate of the DCN stage, so
``senders`` is the host block (the chips of the host inside the slice): 8 v5e chips on 2 NICs get
a quarter NIC each (the per-chip figure), a slice smaller than a host gets more. Counted per host
block, never per chip, so pricing 100k chips costs the same as 8.

**DCN stage algorithms** (``STAGE_ALGORITHMS``; adding one = a closed form, a plan, one row):
``ring`` over the slices, 2(S-1) steps of (dcn_latency + shard / (S rate)) for an all-reduce; a
bidirectional ring would gain nothing as both directions leave through the same NIC. ``tree``
(all-reduce only): a binary reduce then broadcast over the slices, 2 ceil(log2 S) steps of
(dcn_latency + shard / rate): fewer latency steps, S/log2 S times the bytes, so it wins for small
shards over many slices. The cheaper closed form is played.

The DES runs the ICI stages in the root's slice and the DCN stage for the root's chip position
(every slice and chip position is a translate). The network's DCN channels carry the per-chip
figure, so a DCN stage at another rate is played with its bytes scaled by
(per-chip figure / rate): the same times as the closed form, and DCN channel bytes read in
per-chip-figure seconds (only slices smaller than a host differ).
"""

from __future__ import annotations

import functools
import math
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, replace

from tpusim.errors import TpusimError
from tpusim.hardware.spec import ChipSpec, topologies_dir
from tpusim.network.collectives import patterns
from tpusim.network.collectives.closed_form import Axis
from tpusim.network.collectives.common import line_cost, line_phases, phase
from tpusim.network.collectives.groups import Line, Request, axis_line
from tpusim.network.collectives.plan import CollectiveCost, CollectivePlan, Phase, Step, Transfer, TransferStream

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


# --------------------------------------------------------------------------- host NICs

@dataclass(frozen=True)
class HostNics:
    """One generation's DCN hosts: NICs per host and the torus block one host holds."""

    nics_per_host: int
    host_shape: tuple[int, ...]       # () when unknown: every chip counts as its own host
    nic_gbps: float = 0.0             # one NIC, one way (data, cross-checked by the tests)
    basis: str = ""


def dcn_table_path():
    return topologies_dir() / "dcn.toml"


@functools.lru_cache(maxsize=4)
def _table(path: str) -> dict[str, HostNics]:
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        return {}
    except tomllib.TOMLDecodeError as e:
        raise TpusimError(f"{path}: not valid TOML: {e}") from None
    out = {}
    for name, row in data.items():
        try:
            out[name] = HostNics(int(row["nics_per_host"]), tuple(int(n) for n in row["host_shape"]),
                                 float(row["nic_gbps"]), str(row.get("source") or "estimate: " + row["estimate"]))
        except (KeyError, TypeError, ValueError) as e:
            raise TpusimError(f"{path}: table [{name}] needs nics_per_host, host_shape, nic_gbps and a source "
                              f"or estimate ({e!r})") from None
        if out[name].nics_per_host < 1:
            raise TpusimError(f"{path}: [{name}] nics_per_host must be >= 1")
    return out


def host_nics(chip: ChipSpec) -> HostNics:
    """The chip's host NICs from ``topologies/dcn.toml``; a chip without a row (or a topologies folder
    without the file): one NIC per chip at the per-chip figure and no host block (no sharing beyond
    the chip file's own figure)."""
    row = _table(str(dcn_table_path())).get(chip.name)
    if row is None:
        return HostNics(chip.chips_per_host, (), chip.dcn_bytes_per_s * 8 / 1e9,
                        "no row in topologies/dcn.toml: one NIC per chip at dcn_bytes_per_s")
    return row


def senders_per_host(req: Request) -> int:
    """Chips of one host that run a DCN stage at once: the whole host block (within the slice).

    tpusim prices SPMD programs: every chip position of a slice runs its translate of the group's
    DCN stage at the same time, so every chip of a host sends. (``groups.resolve`` keeps ``spmd``
    only for strided or faulted groups, so a group that runs alone cannot be told apart here.)"""
    nics = host_nics(req.slice.chip)
    if not nics.host_shape:
        return req.slice.chip.chips_per_host
    return max(1, math.prod(min(extent, n) for extent, n in zip(nics.host_shape, req.slice.dims, strict=False)))


def chip_dcn_rate(chip: ChipSpec, senders: int) -> float:
    """Bytes/s one chip gets on DCN when ``senders`` chips of its host send at once."""
    nics = host_nics(chip)
    per_nic = chip.dcn_bytes_per_s * chip.chips_per_host / nics.nics_per_host
    return min(chip.pcie_bytes_per_s, per_nic * min(1.0, nics.nics_per_host / senders))


def dcn_axis(req: Request) -> Axis:
    """The DCN ring as the closed forms see it: S slices at the shared per-chip rate."""
    chip = req.slice.chip
    return Axis(req.slice.num_slices, True, chip_dcn_rate(chip, senders_per_host(req)), chip.dcn_latency_ns * 1e-9)


# --------------------------------------------------------------------------- DCN stage algorithms

def _ring_cost(sub: Request, ax: Axis) -> CollectiveCost:
    if sub.kind == "all_to_all":  # each chip's NIC sends (S-1) pieces of B/S, one crossing
        return CollectiveCost(ax.lat, (ax.n - 1) * sub.nbytes / ax.n / ax.bw)
    return line_cost(sub.kind, ax, sub.nbytes, "uni", 0)


def _tree_levels(s: int) -> int:
    return math.ceil(math.log2(s)) if s > 1 else 0


def _tree_cost(sub: Request, ax: Axis) -> CollectiveCost | None:
    if sub.kind != "all_reduce":
        return None
    levels = _tree_levels(ax.n)
    return CollectiveCost(2 * levels * ax.lat, 2 * levels * sub.nbytes / ax.bw)


def _ring_plan(line: Line, sub: Request, scale: float, floor: float) -> list[Phase]:
    if sub.kind == "all_to_all":
        s = line.n
        flows = [(line.path(i, j), scale * sub.nbytes / s) for i in range(s) for j in range(s) if i != j]
        return [phase(patterns.direct(flows, line.copies, floor, pieces=64))]  # few flows: chunk finely
    return line_phases(sub.kind, line, scale * sub.nbytes, "uni", 0)


def _tree_pairs(s: int) -> list[list[tuple[int, int]]]:
    """(sender, receiver) slices per level of a binary reduce towards slice 0: at level k slice
    i + 2^k sends its partial sum to slice i."""
    return [[(i + 2 ** k, i) for i in range(0, s, 2 ** (k + 1)) if i + 2 ** k < s] for k in range(_tree_levels(s))]


def _tree_plan(line: Line, sub: Request, scale: float, floor: float) -> list[Phase]:
    """The binary reduce, then the same tree backwards as a broadcast: one step per level, every
    NIC used at most once per step (so the DES meets no contention and equals the closed form)."""
    nbytes, levels = scale * sub.nbytes, _tree_pairs(line.n)
    up = tuple(Step(tuple(Transfer(line.path(a, b), nbytes) for a, b in pairs)) for pairs in levels)
    down = tuple(Step(tuple(Transfer(line.path(b, a), nbytes) for a, b in pairs)) for pairs in reversed(levels))
    return [Phase((TransferStream(up, line.copies),)), Phase((TransferStream(down, line.copies),))]


@dataclass(frozen=True)
class StageAlgorithm:
    """One way to run the DCN stage: its closed form (None: does not apply) and its plan."""

    name: str
    cost: Callable[[Request, Axis], CollectiveCost | None]
    plan: Callable[[Line, Request, float, float], list[Phase]]


STAGE_ALGORITHMS: dict[str, StageAlgorithm] = {
    "ring": StageAlgorithm("ring", _ring_cost, _ring_plan),
    "tree": StageAlgorithm("tree", _tree_cost, _tree_plan),
}


def choose_stage(sub: Request, ax: Axis) -> tuple[str, CollectiveCost]:
    """The DCN stage algorithm with the cheapest closed form (ring on a tie)."""
    best: tuple[str, CollectiveCost] | None = None
    for name, algo in STAGE_ALGORITHMS.items():
        cost = algo.cost(sub, ax)
        if cost is not None and (best is None or cost.total_s < best[1].total_s):
            best = (name, cost)
    assert best is not None
    return best


# --------------------------------------------------------------------------- the collective

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


def _dcn_plan(req: Request, sub: Request, copies: int) -> tuple[str, list[Phase]]:
    ax = dcn_axis(req)
    name, _ = choose_stage(sub, ax)
    line = axis_line(req.slice, req.dcn_axis, req.root, copies)
    chip = req.slice.chip
    scale = chip.dcn_bytes_per_s / ax.bw          # the network's DCN channels run at the per-chip figure
    floor = chip.dcn_bytes_per_s * chip.dcn_latency_ns * 1e-9 / 8
    return name, STAGE_ALGORITHMS[name].plan(line, sub, scale, floor)


def plan(req: Request, inside: Callable[[Request], tuple[str, CollectivePlan]]) -> CollectivePlan:
    """The stages' plan; ``inside`` is the registry's best ICI plan for a stage inside one slice (handed in,
    so this module does not import the registry that lists it)."""
    phases: list[Phase] = []
    notes = []
    for where, sub, copies in _stages(req):
        if where == "dcn":
            name, dcn_phases = _dcn_plan(req, sub, copies)
            phases.extend(dcn_phases)
            notes.append(f"DCN {sub.kind} by {name} on the root's chip position, "
                         f"{senders_per_host(req)} sender(s) per host")
            continue
        name, inner = inside(sub)
        notes.append(f"ICI {sub.kind} by {name}")
        for ph in inner.phases:  # the slices running it are translates: the root's stands for all
            phases.append(Phase(tuple(replace(s, copies=s.copies * copies) for s in ph.streams)))
    return CollectivePlan(tuple(phases), "; ".join(notes))


def cost(req: Request, inside: Callable[[Request], CollectiveCost]) -> CollectiveCost:
    """The stages' closed form; ``inside`` prices a stage inside one slice by the registry's best algorithm."""
    total = CollectiveCost()
    for where, sub, _copies in _stages(req):
        if where == "dcn":
            total = total + choose_stage(sub, dcn_axis(req))[1]
        else:
            total = total + inside(sub)
    return total
