"""Draw a slice: a 2D grid for 1d/2d slices, a 3D lattice for 3d ones, wraparounds in colour.

Uses matplotlib's Agg canvas through ``matplotlib.figure.Figure`` (no pyplot), so drawing never
touches global backend state and works headless. Wraparound links are drawn as dashed stubs leaving
the lattice at both ends of each wrapped ring; above ``BIG`` chips the ICI links are not drawn one by
one (they would be a solid block) and each wrapped axis gets one labelled dashed arc instead.
"""

from __future__ import annotations

import os

import numpy as np
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure
from mpl_toolkits.mplot3d.art3d import Line3DCollection

from tpusim.slice.topology import Slice

BIG = 512  # chips above which links are summarised instead of drawn one by one
_LINK = "#9a9a9a"
_NODE = "#1f4e79"
_WRAP = ("#d62728", "#2ca02c", "#9467bd")  # per axis x, y, z
_STUB = 0.6  # length of a wraparound stub, in lattice units


def _title(s: Slice) -> str:
    name = getattr(s.chip, "display_name", "") or s.chip.name
    t = f"{s.spec} on {name}: {s.num_chips} chips, {s.num_links} ICI links"
    if s.twisted:
        t += ", twisted"
    if s.num_slices > 1:
        t += f"\nx {s.num_slices} slices over DCN = {s.total_chips} chips"
    wrapped = [n for n, w in zip(s.axis_names, s.wrap, strict=True) if w]
    t += f"\nwraps: {', '.join(wrapped) if wrapped else 'none'}; diameter {s.diameter_hops} hops"
    return t


def _segments(s: Slice, pos: dict) -> tuple[list, list[list]]:
    """Internal link segments, and per-axis wraparound stubs (two per wrap link)."""
    internal: list = []
    stubs: list[list] = [[] for _ in s.dims]
    for c in s.coords():
        for axis, n in enumerate(s.dims):
            if n == 1:
                continue
            nxt = s.neighbor(c, axis, 1)
            if nxt is None:
                continue
            if c[axis] == n - 1:  # wraparound: stub out of the last chip and into the first
                step = np.zeros(len(pos[c]))
                step[axis] = _STUB
                stubs[axis].append((pos[c], pos[c] + step))
                stubs[axis].append((pos[nxt], pos[nxt] - step))
            else:
                internal.append((pos[c], pos[nxt]))
    return internal, stubs


def _draw_2d(fig: Figure, s: Slice) -> None:
    ax = fig.add_subplot()
    dims = [s.dims[0], s.dims[1] if s.ndims > 1 else 1]
    pos = {c: np.array([c[0], c[1] if s.ndims > 1 else 0], dtype=float) for c in s.coords()}
    internal, stubs = _segments(s, pos)
    big = s.num_chips > BIG
    ax.add_collection(LineCollection(internal, colors=_LINK, linewidths=0.5 if big else 1.2, zorder=1))
    for axis, segs in enumerate(stubs):
        if segs:
            ax.add_collection(LineCollection(segs, colors=_WRAP[axis], linestyles=(0, (2, 1)), linewidths=2,
                                             label=f"wraparound ({s.axis_names[axis]})", zorder=1))
    pts = np.array(list(pos.values()))
    ax.scatter(pts[:, 0], pts[:, 1], s=4 if big else 40, c=_NODE, zorder=2)
    if s.num_chips <= 64:
        for c, p in pos.items():
            ax.annotate(str(s.rank_of(c)), p, xytext=(3, 3), textcoords="offset points", fontsize=7)
    ax.set_xlim(-1, dims[0])
    ax.set_ylim(-1, dims[1])
    ax.set_aspect("equal")
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    if any(stubs):
        ax.legend(loc="upper right", fontsize=8, framealpha=0.9)


def _draw_3d(fig: Figure, s: Slice) -> None:
    ax = fig.add_subplot(projection="3d")
    pts = np.array(list(s.coords()), dtype=float)
    big = s.num_chips > BIG
    if not big:
        pos = {c: np.array(c, dtype=float) for c in s.coords()}
        internal, stubs = _segments(s, pos)
        ax.add_collection3d(Line3DCollection(internal, colors=_LINK, linewidths=0.6, alpha=0.7))
        for axis, segs in enumerate(stubs):
            if segs:
                label = f"wraparound ({s.axis_names[axis]})"
                ax.add_collection3d(Line3DCollection(segs, colors=_WRAP[axis], linestyles=(0, (2, 1)),
                                                     linewidths=1.2, label=label))
    else:
        # One labelled arc per wrapped axis, along the lattice edge, bulging outwards.
        for axis, n in enumerate(s.dims):
            if not s.wrap[axis]:
                continue
            t = np.linspace(0.0, np.pi, 60)
            line = np.zeros((60, 3))
            line[:, axis] = (n - 1) / 2 * (1 - np.cos(t))
            other = [a for a in range(3) if a != axis]
            line[:, other[0]] = -0.15 * max(s.dims) * np.sin(t)
            ax.plot(line[:, 0], line[:, 1], line[:, 2], "--", color=_WRAP[axis],
                    label=f"{s.axis_names[axis]} wraps ({s.num_chips // n} wraparound links)")
    ax.scatter(pts[:, 0], pts[:, 1], pts[:, 2], s=1 if big else 18, c=_NODE, depthshade=True)
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    ax.set_zlabel("z")
    ax.set_box_aspect([max(n, 1) for n in s.dims])
    if any(s.wrap):
        ax.legend(loc="upper left", fontsize=7)
    if big:
        ax.text2D(0.0, -0.02, f"{s.num_links} ICI links not drawn individually", transform=ax.transAxes,
                  fontsize=7)


def draw_slice(s: Slice, path: str | os.PathLike) -> str:
    """Draw ``s`` to an image file (format from the suffix, e.g. .png or .svg); returns the path."""
    flat = s.ndims <= 2 or all(n == 1 for n in s.dims[2:])
    if flat:
        nx_, ny_ = s.dims[0], (s.dims[1] if s.ndims > 1 else 1)
        fig = Figure(figsize=(7, 2.5 + 4.5 * min(1.5, ny_ / nx_)))
    else:
        fig = Figure(figsize=(8, 7))
    if flat:
        _draw_2d(fig, s)
    else:
        _draw_3d(fig, s)
    fig.suptitle(_title(s), fontsize=10)
    fig.savefig(os.fspath(path), dpi=120, bbox_inches="tight")
    return os.fspath(path)
