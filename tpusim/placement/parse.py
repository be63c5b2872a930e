"""``--placement`` text -> Placement: ``tp=x,fsdp=yz``, ``tp=x4,fsdp=x2yz`` (syntax in tpusim/placement/__init__);
errors name the dim, the axes and what is accepted.

Two steps, because the DeviceMesh is known only once the script has run: ``parse_placement_text`` reads the
text against the slice alone (``tpusim run`` calls it before the script, so a typo costs no work), and
``parse_placement`` then matches the dims to the recorded mesh."""

from __future__ import annotations

import re

from tpusim.errors import TpusimError, plain_text, shown
from tpusim.placement.mesh import Mesh, Placement, Wanted, assign, check_fits, default_placement
from tpusim.slice.topology import AXIS_NAMES, Slice

_PAIR = re.compile(r" *([A-Za-z_][A-Za-z0-9_.-]*) *= *((?:[xyz][0-9]*)+) *", re.ASCII)
_SEG = re.compile(r"([xyz])([0-9]*)", re.ASCII)
_MAX_LENGTH = 256

Segments = dict[str, list[tuple[int, int | None]]]     # dim name -> [(axis, chip count or None)] in order


def parse_placement_text(text: str, slice_: Slice) -> Segments:
    """'tp=x4,fsdp=x2yz' -> {dim: [(axis, count)]}, checked against the slice (axis letters it has, counts
    from 1 to the axis length) but not yet against a DeviceMesh; a dim named twice takes both lists."""
    axes_ok = "".join(AXIS_NAMES[: slice_.ndims])
    accepted = (f"accepted: DIM=AXES pairs separated by commas, e.g. tp=x,fsdp=yz; axes are letters of "
                f"{axes_ok}, each optionally followed by a chip count")
    plain_text(text, "--placement", accepted, max_length=_MAX_LENGTH)
    wanted: Segments = {}
    for pair in filter(None, (p.strip(" ") for p in text.split(","))):
        m = _PAIR.fullmatch(pair)
        if m is None:
            raise TpusimError(f"--placement {shown(text)}: {shown(pair)} is not DIM=AXES (e.g. tp=x or fsdp=yz; "
                              f"axes are letters of {axes_ok}, each optionally followed by a chip count)")
        name, axes = m.group(1), m.group(2)
        segments = wanted.setdefault(name, [])
        for letter, count in _SEG.findall(axes):
            axis = AXIS_NAMES.index(letter)
            if axis >= slice_.ndims:
                raise TpusimError(f"--placement {shown(text)}: {slice_.spec} has no axis {letter}; accepted: {axes_ok}")
            if count and not 1 <= int(count) <= slice_.dims[axis]:
                raise TpusimError(f"--placement {shown(text)}: {name}={letter}{count} asks for {int(count)} chips "
                                  f"of axis {letter}, which has {slice_.dims[axis]}; a count is 1 to "
                                  f"{slice_.dims[axis]}")
            segments.append((axis, int(count) if count else None))
    if not wanted:
        raise TpusimError(f"--placement {shown(text)} names no dim; {accepted}")
    return wanted


def parse_placement(text: str, mesh: Mesh, slice_: Slice) -> Placement:
    """'tp=x,fsdp=yz' -> Placement; errors name the dim, the axes and what is accepted."""
    check_fits(mesh, slice_)
    segments = parse_placement_text(text, slice_)
    wanted: Wanted = {}
    for name, axes in segments.items():
        if name not in mesh.dim_names:
            raise TpusimError(f"--placement {shown(text)}: {name!r} is not a dim of the DeviceMesh; its dims are "
                              f"{', '.join(mesh.dim_names)}")
        wanted[mesh.dim_names.index(name)] = list(axes)
    missing = [mesh.dim_names[d] for d, n in enumerate(mesh.shape) if n > 1 and d not in wanted]
    if missing:
        raise TpusimError(f"--placement {shown(text)} does not place mesh dim(s) {', '.join(missing)}; "
                          f"name every dim, e.g. {default_placement(mesh, slice_).text(slice_)}")
    return assign(mesh, slice_, wanted)
