"""The placement model: a recorded DeviceMesh, the torus segments each of its dims occupies, and the
default mapping (innermost dim on x first). Everything else in tpusim/placement builds on these."""

from __future__ import annotations

import math
from dataclasses import dataclass

from tpusim.errors import TpusimError
from tpusim.slice.topology import AXIS_NAMES, Slice
from tpusim.trace.records import Mesh, Trace

__all__ = ["Mesh", "MeshSegment", "Placement", "Wanted", "assign", "check_fits", "default_placement", "trace_mesh"]

Wanted = dict[int, list[tuple[int, int | None]]]   # mesh dim -> [(torus axis, chips taken or None = what fits)]


@dataclass(frozen=True)
class MeshSegment:
    """``size`` chips along torus ``axis``, ``stride`` apart in that axis' coordinate."""

    axis: int
    size: int
    stride: int


@dataclass(frozen=True)
class Placement:
    """Mesh dim -> segments of torus axes (innermost segment first)."""

    mesh: Mesh
    dims: tuple[tuple[MeshSegment, ...], ...]   # one entry per mesh dim, in mesh order

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


def trace_mesh(trace: Trace) -> Mesh | None:
    """The recorded DeviceMesh that covers the whole world (the first one), or None."""
    for mesh in trace.meta.meshes or ():
        if mesh.size == trace.world_size and sorted(mesh.ranks) == list(range(trace.world_size)):
            return mesh
    return None


def check_fits(mesh: Mesh, slice_: Slice) -> None:
    if slice_.num_slices > 1:
        raise TpusimError("placement maps mesh dims onto one slice's ICI axes; multislice is not supported yet")
    if mesh.size != slice_.num_chips:
        raise TpusimError(f"the DeviceMesh {dict(zip(mesh.dim_names, mesh.shape))} has {mesh.size} ranks but "
                          f"{slice_.spec} has {slice_.num_chips} chips: a placement needs one rank per chip")


def assign(mesh: Mesh, slice_: Slice, wanted: Wanted) -> Placement:
    """Give each mesh dim (innermost first) its requested (axis, count) list; see tpusim/placement/__init__."""
    used = [1] * slice_.ndims          # chips of each axis already handed out (the next stride)
    dims: list[tuple[MeshSegment, ...]] = [()] * len(mesh.shape)
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
                segs.append(MeshSegment(axis, take, used[axis]))
            used[axis] *= take
            need //= take
        if need != 1:
            raise TpusimError(f"placement: mesh dim {name} (size {mesh.shape[d]}) is {need}x short of chips; "
                              f"give it more axes, e.g. {name}={''.join(AXIS_NAMES[:slice_.ndims])}")
        dims[d] = tuple(segs)
    return Placement(mesh, tuple(dims))


def default_placement(mesh: Mesh, slice_: Slice) -> Placement:
    """Innermost mesh dim first onto x, then y, then z (the identity numbering)."""
    check_fits(mesh, slice_)
    used = [1] * slice_.ndims
    wanted: Wanted = {}
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
    return assign(mesh, slice_, wanted)
