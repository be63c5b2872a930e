"""Placement: which torus axes each DeviceMesh dimension runs on, and what that does to step time.

A DeviceMesh lays ranks out row-major (the last, innermost dim varies fastest); the slice numbers
chips x-fastest. A placement maps each mesh dim to *segments* of torus axes: ``(axis, size,
stride)`` = ``size`` chips along ``axis``, ``stride`` apart in that axis' coordinate. The trace is
recorded once with logical ranks; ``remap`` rewrites every collective's group (and, for a
multi-rank trace, every record's rank) to the physical ranks under a placement, so the engine
prices the collectives on the mapped axes. Nothing here imports torch.

**Default mapping**: mesh dims from the innermost (usually tensor parallel) outwards take torus
axes in the order x, y, z, consecutive chips first. So a (fsdp=64, tp=8) mesh on 3d:8x8x8 puts tp
on x (one axis of 8, wrapped when the slice is whole cubes) and fsdp on the y-z plane; this is
exactly the identity rank -> ``Slice.coord_of(rank)``.

**Syntax** (``--placement``): ``dim=AXES`` pairs, comma separated; AXES is axis letters, each
optionally followed by how many of its chips the dim takes: ``tp=x,fsdp=yz``, ``tp=y,fsdp=xz``,
``tp=x4,fsdp=x2yz`` (tp on 4 consecutive chips of x; fsdp on the other factor 2 of x, then y, z).
Without a count a dim takes what it still needs from that axis, or the whole axis.

**Compare** (``--compare-placements``): every distinct placement (up to torus symmetry: axes of
equal length and wraparound are interchangeable), priced and ranked by step time, with the reason
the best one wins: the mesh dim whose collectives gained most, on how many axes, wrapped or not.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from tpusim.errors import TpusimError
from tpusim.timeline import step_stats
from tpusim.topology import AXIS_NAMES, Slice
from tpusim.trace import CollectiveRecord, Trace

MAX_PLACEMENTS = 24
_PAIR = re.compile(r"\s*([A-Za-z_][\w.-]*)\s*=\s*((?:[xyz]\d*)+)\s*")
_SEG = re.compile(r"([xyz])(\d*)")


@dataclass(frozen=True)
class Mesh:
    """A DeviceMesh layout as the backend recorded it (trace.meta["meshes"])."""

    dim_names: tuple[str, ...]
    shape: tuple[int, ...]
    ranks: tuple[int, ...]        # logical rank at each mesh index, row-major

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Segment:
    axis: int
    size: int
    stride: int


@dataclass(frozen=True)
class Placement:
    """Mesh dim -> segments of torus axes (innermost segment first)."""

    mesh: Mesh
    dims: tuple[tuple[Segment, ...], ...]   # one entry per mesh dim, in mesh order

    def text(self, slice_: Slice) -> str:
        parts = []
        for name, segs in zip(self.mesh.dim_names, self.dims):
            axes = "".join(AXIS_NAMES[s.axis] + ("" if s.size == slice_.dims[s.axis] else str(s.size))
                           for s in segs)
            parts.append(f"{name}={axes or '-'}")
        return ",".join(reversed(parts))   # innermost dim first, as people write "tp=x,fsdp=yz"

    def physical(self, slice_: Slice) -> dict[int, int]:
        """Logical rank -> physical rank (x-fastest numbering of the slice)."""
        out = {}
        for flat, logical in enumerate(self.mesh.ranks):
            index = _unravel(flat, self.mesh.shape)
            coord = [0] * slice_.ndims
            for i, segs in zip(index, self.dims):
                for s in segs:
                    i, digit = divmod(i, s.size)
                    coord[s.axis] += digit * s.stride
            out[logical] = slice_.rank_of(tuple(coord))
        return out


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    index = []
    for n in reversed(shape):
        flat, i = divmod(flat, n)
        index.append(i)
    return tuple(reversed(index))


# ---- meshes and placements ------------------------------------------------------------------------

def trace_mesh(trace: Trace) -> Mesh | None:
    """The recorded DeviceMesh that covers the whole world (the first one), or None."""
    for m in trace.meta.get("meshes", []):
        mesh = Mesh(tuple(m["dim_names"]), tuple(m["shape"]), tuple(m["ranks"]))
        if mesh.size == trace.world_size and sorted(mesh.ranks) == list(range(trace.world_size)):
            return mesh
    return None


def _check_fits(mesh: Mesh, slice_: Slice) -> None:
    if slice_.num_slices > 1:
        raise TpusimError("placement maps mesh dims onto one slice's ICI axes; multislice is not supported yet")
    if mesh.size != slice_.num_chips:
        raise TpusimError(f"the DeviceMesh {dict(zip(mesh.dim_names, mesh.shape))} has {mesh.size} ranks but "
                          f"{slice_.spec} has {slice_.num_chips} chips: a placement needs one rank per chip")


def _assign(mesh: Mesh, slice_: Slice, wanted: dict[int, list[tuple[int, int | None]]]) -> Placement:
    """Give each mesh dim (innermost first) its requested (axis, count) list; see the module docstring."""
    used = [1] * slice_.ndims          # chips of each axis already handed out (the next stride)
    dims: list[tuple[Segment, ...]] = [()] * len(mesh.shape)
    for d in reversed(range(len(mesh.shape))):
        need, segs, name = mesh.shape[d], [], mesh.dim_names[d]
        for axis, count in wanted.get(d, []):
            left = slice_.dims[axis] // used[axis]
            take = count if count is not None else (left if need >= left else need)
            if take < 1 or left % take or need % take:
                raise TpusimError(f"placement: {name}={AXIS_NAMES[axis]}{count or ''} does not fit: {name} needs "
                                  f"{need} more chip(s) and axis {AXIS_NAMES[axis]} has {left} left of "
                                  f"{slice_.dims[axis]}; counts must divide both")
            if take > 1:
                segs.append(Segment(axis, take, used[axis]))
            used[axis] *= take
            need //= take
        if need != 1:
            raise TpusimError(f"placement: mesh dim {name} (size {mesh.shape[d]}) is {need}x short of chips; "
                              f"give it more axes, e.g. {name}={''.join(AXIS_NAMES[:slice_.ndims])}")
        dims[d] = tuple(segs)
    return Placement(mesh, tuple(dims))


def default_placement(mesh: Mesh, slice_: Slice) -> Placement:
    """Innermost mesh dim first onto x, then y, then z (the identity numbering; module docstring)."""
    _check_fits(mesh, slice_)
    used = [1] * slice_.ndims
    wanted: dict[int, list[tuple[int, int | None]]] = {}
    for d in reversed(range(len(mesh.shape))):
        need = mesh.shape[d]
        for axis in range(slice_.ndims):
            left = slice_.dims[axis] // used[axis]
            if need == 1 or left == 1:
                continue
            take = math.gcd(need, left)
            wanted.setdefault(d, []).append((axis, take))
            used[axis] *= take
            need //= take
    return _assign(mesh, slice_, wanted)


def parse_placement(text: str, mesh: Mesh, slice_: Slice) -> Placement:
    """'tp=x,fsdp=yz' -> Placement; errors name the dim, the axes and what is accepted."""
    _check_fits(mesh, slice_)
    axes_ok = "".join(AXIS_NAMES[: slice_.ndims])
    wanted: dict[int, list[tuple[int, int | None]]] = {}
    for pair in filter(None, (p.strip() for p in text.split(","))):
        m = _PAIR.fullmatch(pair)
        if m is None:
            raise TpusimError(f"--placement {text!r}: {pair!r} is not DIM=AXES (e.g. tp=x or fsdp=yz; axes "
                              f"are letters of {axes_ok}, each optionally followed by a chip count)")
        name, axes = m.group(1), m.group(2)
        if name not in mesh.dim_names:
            raise TpusimError(f"--placement {text!r}: {name!r} is not a dim of the DeviceMesh; its dims are "
                              f"{', '.join(mesh.dim_names)}")
        d = mesh.dim_names.index(name)
        for letter, count in _SEG.findall(axes):
            axis = AXIS_NAMES.index(letter)
            if axis >= slice_.ndims:
                raise TpusimError(f"--placement {text!r}: {slice_.spec} has no axis {letter}; accepted: {axes_ok}")
            wanted.setdefault(d, []).append((axis, int(count) if count else None))
    missing = [mesh.dim_names[d] for d, n in enumerate(mesh.shape) if n > 1 and d not in wanted]
    if missing:
        raise TpusimError(f"--placement {text!r} does not place mesh dim(s) {', '.join(missing)}; "
                          f"name every dim, e.g. {default_placement(mesh, slice_).text(slice_)}")
    return _assign(mesh, slice_, wanted)


def _factorizations(n: int, axes: list[tuple[int, int]]) -> Iterator[list[tuple[int, int]]]:
    """Ordered (axis, count) lists whose counts multiply to n, each count dividing its axis' room."""
    if n == 1:
        yield []
        return
    for i, (axis, room) in enumerate(axes):
        for take in range(2, min(n, room) + 1):
            if n % take == 0 and room % take == 0:
                rest = axes[:i] + axes[i + 1:]
                for tail in _factorizations(n // take, rest):
                    yield [(axis, take), *tail]


def _symmetries(slice_: Slice) -> list[tuple[int, ...]]:
    sig = [(slice_.dims[a], slice_.wrap[a]) for a in range(slice_.ndims)]
    return [p for p in itertools.permutations(range(slice_.ndims)) if all(sig[a] == sig[p[a]] for a in range(len(p)))]


def _key(p: Placement, perm: tuple[int, ...]) -> tuple:
    return tuple(tuple(sorted((perm[s.axis], s.size, s.stride) for s in segs)) for segs in p.dims)


def enumerate_placements(mesh: Mesh, slice_: Slice, limit: int = MAX_PLACEMENTS) -> list[Placement]:
    """Every distinct placement (default first), one per class of torus symmetry, at most ``limit``."""
    _check_fits(mesh, slice_)
    first = default_placement(mesh, slice_)
    perms = _symmetries(slice_)
    seen = {min(_key(first, p) for p in perms)}
    out = [first]

    def place(d: int, used: list[int], wanted: dict) -> Iterator[dict]:
        if d < 0:
            yield wanted
            return
        room = [(a, slice_.dims[a] // used[a]) for a in range(slice_.ndims) if slice_.dims[a] // used[a] > 1]
        for combo in _factorizations(mesh.shape[d], room):
            nxt = list(used)
            for a, take in combo:
                nxt[a] *= take
            yield from place(d - 1, nxt, {**wanted, d: [(a, t) for a, t in combo]})

    for wanted in place(len(mesh.shape) - 1, [1] * slice_.ndims, {}):
        p = _assign(mesh, slice_, wanted)
        key = min(_key(p, perm) for perm in perms)
        if key not in seen:
            seen.add(key)
            out.append(p)
            if len(out) >= limit:
                break
    return out


# ---- repricing ------------------------------------------------------------------------------------

def remap(trace: Trace, slice_: Slice, placement: Placement) -> Trace:
    """The trace with every collective group (and, for multi-rank traces, every rank) made physical."""
    return _renumber_ranks(trace, placement.physical(slice_), {**trace.meta, "placement": placement.text(slice_)})


def _renumber_ranks(trace: Trace, ranks: dict[int, int], meta: dict) -> Trace:
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


@dataclass(frozen=True)
class Priced:
    placement: str
    total_s: float
    step_s: float
    collective_s: float
    by_dim: dict[str, float]           # mesh dim -> summed collective time
    axes: dict[str, str]               # mesh dim -> how its chips sit on the torus
    algorithms: dict[str, str]         # mesh dim -> algorithm of its largest collective


def describe_segments(segs: tuple[Segment, ...], slice_: Slice) -> str:
    if not segs:
        return "no chips (size 1)"
    parts = []
    for s in segs:
        whole = s.size == slice_.dims[s.axis]
        ring = "wrapped ring" if whole and slice_.wrap[s.axis] else ("line" if whole else "part of the axis")
        parts.append(f"{AXIS_NAMES[s.axis]}: {s.size} chips, {ring}")
    return f"{len(segs)} " + ("axes" if len(segs) > 1 else "axis") + " (" + "; ".join(parts) + ")"


def price_placement(trace: Trace, slice_: Slice, placement: Placement, simulate: Callable) -> Priced:
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
    return Priced(placement.text(slice_), timeline.total_s, step_s, sum(by_dim.values()), by_dim, axes,
                  {d: a for d, (_, a) in biggest.items()})


def compare(trace: Trace, slice_: Slice, simulate: Callable, limit: int = MAX_PLACEMENTS) -> dict:
    """Every distinct placement ranked by step time, with the reason the best wins (report section)."""
    mesh = trace_mesh(trace)
    if mesh is None:
        return {"mesh": None, "ranked": [], "reason": "no DeviceMesh covering the whole world was recorded: "
                                                      "placement only moves DeviceMesh dims"}
    priced = [price_placement(trace, slice_, p, simulate) for p in enumerate_placements(mesh, slice_, limit)]
    ranked = sorted(priced, key=lambda p: (p.step_s, p.collective_s, p.placement))
    return {"mesh": {"dim_names": list(mesh.dim_names), "shape": list(mesh.shape)},
            "default": priced[0].placement,
            "ranked": [dataclasses.asdict(p) for p in ranked],
            "reason": why_best(ranked)}


def why_best(ranked: list[Priced]) -> str:
    """The best placement against the runner-up: the mesh dim whose collectives differ most, and why."""
    if len(ranked) < 2:
        return "only one distinct placement: every mapping of this mesh is equivalent on this torus"
    best, other = ranked[0], ranked[1]
    if other.step_s <= best.step_s * (1 + 1e-9) and other.collective_s <= best.collective_s * (1 + 1e-9):
        return f"{best.placement} and {other.placement} tie (the torus is symmetric for this mesh)"
    dims = set(best.by_dim) | set(other.by_dim)
    dim = max(dims, key=lambda d: other.by_dim.get(d, 0.0) - best.by_dim.get(d, 0.0))
    gain = other.by_dim.get(dim, 0.0) - best.by_dim.get(dim, 0.0)
    return (f"{best.placement} wins ({_fmt(best.step_s)} per step vs {_fmt(other.step_s)} for {other.placement}): "
            f"its {dim} collectives take {_fmt(best.by_dim.get(dim, 0.0))} instead of "
            f"{_fmt(other.by_dim.get(dim, 0.0))} ({_fmt(gain)} less) because {dim} runs on "
            f"{best.axes.get(dim, '?')} with {best.algorithms.get(dim, '?')} instead of "
            f"{other.axes.get(dim, '?')} with {other.algorithms.get(dim, '?')}")


def _fmt(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} us"


# ---- tpusim run glue ------------------------------------------------------------------------------

def apply_placement(trace: Trace, slice_: Slice, text: str | None) -> Trace:
    """``--placement``: the trace remapped onto the named axes (unchanged without a flag or a mesh)."""
    if not text:
        return trace
    mesh = trace_mesh(trace)
    if mesh is None:
        raise TpusimError("--placement needs a DeviceMesh covering every rank (init_device_mesh('tpu', ...)); "
                          "this script recorded none")
    return remap(trace, slice_, parse_placement(text, mesh, slice_))


def report_sections(trace: Trace, slice_: Slice, compare_all: bool, simulate: Callable) -> dict:
    """The report's ``distributed`` and ``placements`` sections (see tpusim/report/model.py)."""
    from tpusim.report.model import rounded

    out: dict = {}
    ranks = trace.meta.get("ranks")
    if ranks:
        one = trace.meta.get("ranks_one", {})
        out["distributed"] = {"ranks": ranks, "world_size": trace.world_size,
                              "placement": trace.meta.get("placement") or _default_text(trace, slice_),
                              "numerics_rule": one.get("rule", "") if ranks == "one" else "exact (every rank ran)",
                              "not_reference_correct": one.get("not_reference_correct", []) if ranks == "one" else []}
    if compare_all:
        out["placements"] = rounded(compare(_logical(trace, slice_), slice_, simulate))
    return out


def _default_text(trace: Trace, slice_: Slice) -> str:
    mesh = trace_mesh(trace)
    if mesh is None or mesh.size != slice_.num_chips or slice_.num_slices > 1:
        return ""
    return default_placement(mesh, slice_).text(slice_)


def _logical(trace: Trace, slice_: Slice) -> Trace:
    """Undo --placement (compare starts from logical ranks): the default placement is the identity."""
    text = trace.meta.get("placement")
    mesh = trace_mesh(trace)
    if not text or mesh is None:
        return trace
    phys = parse_placement(text, mesh, slice_).physical(slice_)
    back = {p: logical for logical, p in phys.items()}
    return _renumber_ranks(trace, back, {k: v for k, v in trace.meta.items() if k != "placement"})


def format_placements(report: dict) -> str:
    """Lines for the terminal after the summary: the ranking and why the best wins ('' without one)."""
    section = report.get("placements")
    dist = report.get("distributed")
    lines = []
    if dist and dist.get("ranks") == "one" and dist.get("not_reference_correct"):
        kinds = sorted({e["kind"] for e in dist["not_reference_correct"]})
        lines.append(f"--ranks one: values after {', '.join(kinds)} follow the symmetry rule and are not "
                     f"reference-correct (report.json: distributed)")
    if section and section.get("ranked"):
        lines.append("placements (ranked by step time):")
        for i, p in enumerate(section["ranked"], 1):
            lines.append(f"  {i}. {p['placement']:<28} step {_fmt(p['step_s']):>10}  collectives "
                         f"{_fmt(p['collective_s']):>10}")
        lines.append(f"  {section['reason']}")
    elif section:
        lines.append(f"placements: {section['reason']}")
    return "".join(line + "\n" for line in lines)
