"""``--placement`` text -> Placement: ``tp=x,fsdp=yz``, ``tp=x4,fsdp=x2yz`` (syntax in tpusim/placement/__init__);
errors name the dim, the axes and what is accepted."""

from __future__ import annotations

import re

from tpusim.errors import TpusimError
from tpusim.placement.mesh import Mesh, Placement, Wanted, assign, check_fits, default_placement
from tpusim.topology import AXIS_NAMES, Slice

_PAIR = re.compile(r"\s*([A-Za-z_][\w.-]*)\s*=\s*((?:[xyz]\d*)+)\s*")
_SEG = re.compile(r"([xyz])(\d*)")


def parse_placement(text: str, mesh: Mesh, slice_: Slice) -> Placement:
    """'tp=x,fsdp=yz' -> Placement; errors name the dim, the axes and what is accepted."""
    check_fits(mesh, slice_)
    axes_ok = "".join(AXIS_NAMES[: slice_.ndims])
    wanted: Wanted = {}
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
    return assign(mesh, slice_, wanted)
