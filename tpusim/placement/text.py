"""Placement in words: how a mesh dim's chips sit on the torus, and seconds as the ranking prints them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpusim.slice.topology import AXIS_NAMES, Slice

if TYPE_CHECKING:
    from tpusim.placement.mesh import MeshSegment


def describe_segments(segs: tuple[MeshSegment, ...], slice_: Slice) -> str:
    if not segs:
        return "no chips (size 1)"
    parts = []
    for s in segs:
        whole = s.size == slice_.dims[s.axis]
        ring = "wrapped ring" if whole and slice_.wrap[s.axis] else ("line" if whole else "part of the axis")
        parts.append(f"{AXIS_NAMES[s.axis]}: {s.size} chips, {ring}")
    return f"{len(segs)} " + ("axes" if len(segs) > 1 else "axis") + " (" + "; ".join(parts) + ")"


def fmt_seconds(seconds: float) -> str:
    """Three significant digits and a unit: what the ranking and the winner's reason print."""
    if seconds >= 1:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} us"
