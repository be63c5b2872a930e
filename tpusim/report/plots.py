"""The report's figures, drawn from a ``Report`` (tpusim/report/schema.py), so a notebook can redraw a saved
run from its loaded report.json.

Each function returns a matplotlib ``Figure`` (no pyplot state, safe in tests and servers), laid out at the
resolution it is saved at and settled (``_settled``): every text inside the figure's edges. ``save_figures``
writes them all as PNG and returns their paths.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PathCollection
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from matplotlib.text import Annotation
from matplotlib.ticker import MaxNLocator
from matplotlib.transforms import Bbox

from tpusim.hardware.compute import rate_class
from tpusim.report.schema import Report

DEVICE_COLOURS = {"mxu": "#1f77b4", "vpu": "#2ca02c", "transcendental": "#17becf", "hbm": "#ff7f0e",
                  "sparsecore": "#9467bd", "launch": "#8c564b", "collective_exposed": "#d62728",
                  "idle": "#c7c7c7"}
DEVICE_LABELS = {"mxu": "MXU", "vpu": "VPU", "transcendental": "transcendentals", "hbm": "HBM-bound",
                 "sparsecore": "SparseCore", "launch": "kernel launch", "collective_exposed": "exposed collectives",
                 "idle": "idle (waiting for the host)"}
VISIBLE_SHARE = 0.002    # a series under 0.2% of the widest bar is not drawn (it would be a legend entry with no bar)
MODE_ORDER = ("debug", "strict", "fused")
DPI = 110               # the PNGs' resolution; each figure is laid out at it, so what a test measures is what is saved
LAYOUT_PASSES = 6       # constrained layout settles in two or three draws; more means it oscillates
TITLE_GAP_PT = 5        # space above and below a figure's title: about a line of the panel titles under it
FIT_ROUNDS = 3          # times a figure may grow to take in text its layout could not


def _figure(width: float, height: float) -> Figure:
    """A figure laid out by constrained layout at the saved resolution, with a renderer to measure text by."""
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _positions(fig: Figure) -> list[tuple[float, ...]]:
    return [tuple(np.round(ax.get_position().bounds, 5)) for ax in fig.axes]


def _converge(fig: Figure) -> None:
    """Draw until the axes stop moving. Constrained layout measures tick labels once per draw, before a
    fixed-aspect axes (the heat map's square cells) has its final size, so a single draw (what savefig does)
    can leave an axis label below the bottom edge ("chip x" in links.png). One draw when already settled."""
    before = _positions(fig)
    for _ in range(LAYOUT_PASSES):
        fig.draw_without_rendering()
        after = _positions(fig)
        if after == before:
            return
        before = after


def _overflow(fig: Figure) -> tuple[float, float]:
    """How far (inches, width and height) the drawn artists reach past the figure's edges, both sides summed."""
    inside, edges = fig.get_tightbbox(fig.canvas.get_renderer()), fig.bbox_inches
    return (max(0.0, edges.x0 - inside.x0) + max(0.0, inside.x1 - edges.x1),
            max(0.0, edges.y0 - inside.y0) + max(0.0, inside.y1 - edges.y1))


def _settled(fig: Figure) -> Figure:
    """Lay the figure out until it stops moving, then grow it by whatever still reaches past its edges (text
    the layout cannot shrink, such as a title wider than the figure) and lay it out again."""
    for _ in range(FIT_ROUNDS):
        _converge(fig)
        wide, tall = _overflow(fig)
        if not wide and not tall:
            break
        width, height = fig.get_size_inches()
        fig.set_size_inches(width + wide + 0.1 * bool(wide), height + tall + 0.1 * bool(tall))
    return fig


def _modes(report: Report) -> list[str]:
    names = list(report.modes)
    return sorted(names, key=lambda m: (MODE_ORDER.index(m) if m in MODE_ORDER else len(MODE_ORDER), m))


def _time_unit(seconds: float) -> tuple[str, float]:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return unit, scale
    return "ns", 1e-9


def mode_comparison(report: Report) -> Figure:
    """Step time per eager mode (median of the steady-state steps), each bar saying how many times faster it
    is than the slowest mode (the bare "1.52x" said of what to nobody)."""
    modes = _modes(report)
    times = [report.modes[m].time_s for m in modes]
    unit, scale = _time_unit(max(times))
    fig = _figure(6, 3.2)
    ax = fig.subplots()
    bars = ax.bar(modes, [t / scale for t in times], color="#4c72b0")
    slowest = modes[times.index(max(times))]
    for bar, mode, t in zip(bars, modes, times):
        speedup = f"\n{max(times) / t:.2f}x faster than {slowest}" if t and mode != slowest else ""
        ax.annotate(f"{t / scale:.3g} {unit}{speedup}" if t else "0", (bar.get_x() +
                    bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8)
    ax.set_ylabel(f"{report.modes[modes[0]].timed} ({unit})")
    ax.set_title("Simulated step time per eager mode")
    ax.margins(y=0.25)
    return _settled(fig)


def time_breakdown(report: Report) -> Figure:
    """Where the device's time goes in an average steady-state step (warm-up steps excluded): op time by
    limiting term, exposed collectives, idle. Series too thin to see are left out, legend entry and all."""
    modes = _modes(report)
    total = max(sum((report.modes[m].step_device_s or {}).values()) for m in modes) or 1.0
    unit, scale = _time_unit(total)
    fig = _figure(7, 1.2 + 0.6 * len(modes))
    ax = fig.subplots()
    left = np.zeros(len(modes))
    for term, colour in DEVICE_COLOURS.items():
        widths = np.array([(report.modes[m].step_device_s or {}).get(term, 0.0) / scale for m in modes])
        if widths.max(initial=0.0) > VISIBLE_SHARE * total / scale:
            ax.barh(modes, widths, left=left, color=colour, label=DEVICE_LABELS.get(term, term))
            left += widths
    ax.set_xlabel(f"simulated time ({unit}) of one steady-state step, per chip")
    ax.set_title("Device time breakdown")
    if ax.get_legend_handles_labels()[0]:       # a run with no ops has nothing to label
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=4, fontsize=8, frameon=False)
    return _settled(fig)


ROOF_COLOURS = {"bf16": "black", "f32": "#c44e52", "int8": "#55a868", "fp8": "#8172b2"}
LABELLED_OPS = 5        # the costliest ops are numbered on the plot and named in a list beside it


def roofline(report: Report, mode: str | None = None) -> Figure:
    """Ops as points (arithmetic intensity, achieved FLOP/s) under the chip's roofline: one roof per dtype the
    ops ran in (a float32 matmul is measured against the float32 peak it was priced at, not bf16's), each op
    coloured as its roof; the costliest ops numbered beside their bubbles, never on one (``_number_bubbles``),
    their names listed beside the plot (names on the points overlapped)."""
    chip = report.chip
    mode = mode or _modes(report)[-1]
    ops = [o for o in report.modes[mode].top_ops if o.bytes > 0 and o.flops > 0 and o.seconds > 0]
    peaks = chip.peak_flops_per_s or {"bf16": chip.peak_bf16_flops_per_s}
    kinds = sorted({rate_class(o.dtype) for o in ops} & set(peaks) or {"bf16"}, key=list(ROOF_COLOURS).index)
    bandwidth = chip.hbm_bytes_per_s
    fig = _figure(7.5, 4)
    ax = fig.subplots()
    roofs: dict[float, list[str]] = {}                  # dtypes with one peak share one roof (f32 at one pass = bf16)
    for kind in kinds:
        roofs.setdefault(peaks[kind], []).append(kind)
    x = np.logspace(-2, max(4.0, np.log10(max(roofs) / bandwidth) + 2), 200)
    for peak, sharing in roofs.items():
        ax.loglog(x, np.minimum(peak, x * bandwidth), color=ROOF_COLOURS[sharing[0]], lw=1.5,
                  label=f"{'/'.join(sharing)} roof (ridge {peak / bandwidth:.0f} FLOP/B)")
    ax.set_xlabel("arithmetic intensity (FLOP / HBM byte)")
    ax.set_ylabel("achieved FLOP/s")
    ax.set_title(f"Roofline of {chip.display_name} ({mode} mode)", wrap=True)
    if not ops:
        ax.legend(fontsize=8, loc="lower right")
        return _settled(fig)
    intensity = np.array([o.flops / o.bytes for o in ops])
    achieved = np.array([o.flops / o.seconds for o in ops])
    sizes = np.array([o.seconds for o in ops])
    colours = [ROOF_COLOURS.get(rate_class(o.dtype), "black") for o in ops]
    points = ax.scatter(intensity, achieved, s=20 + 200 * sizes / sizes.max(), alpha=0.6, color=colours,
                        edgecolor="black", linewidth=0.5, label="ops (size = time)")
    names = [f"{number}  {o.op.replace('aten::', '')} ({o.dtype or '-'})"
             for number, o in enumerate(ops[:LABELLED_OPS], start=1)]
    ax.text(1.02, 1.0, "costliest ops\n" + "\n".join(names), transform=ax.transAxes, fontsize=7.5,
            va="top", family="monospace")
    ax.legend(fontsize=8, loc="lower right")
    _settled(fig)                   # the bubbles' places on the page are final before the numbers go beside them
    for _ in range(FIT_ROUNDS):
        before = _positions(fig)
        numbers = _number_bubbles(ax, points, len(names))
        if _positions(_settled(fig)) == before:
            break
        for number in numbers:      # the page moved: place them again against the bubbles' new places
            number.remove()
    return fig


DIRECTIONS = ((1, 1), (1, 0), (1, -1), (0, 1), (0, -1), (-1, 1), (-1, 0), (-1, -1))   # up-right first, as before
GAPS_PT = (1.5, 5.0, 10.0, 18.0, 30.0, 48.0)    # a number's distance from its bubble's edge, nearest first
LEADER_GAP_PT = 5.0     # a number further out than this gets a line to its bubble


def _bubble_boxes(points: PathCollection, dpi: float) -> list[Bbox]:
    """Each bubble's box on the page (pixels): its centre plus the radius its size (points squared) gives,
    edge line included."""
    centres = points.get_offset_transform().transform(points.get_offsets())
    widths = np.broadcast_to(points.get_linewidths(), len(centres))
    boxes = []
    for (cx, cy), size, width in zip(centres, np.broadcast_to(points.get_sizes(), len(centres)), widths):
        radius = (np.sqrt(size) + width) / 2 * dpi / 72
        boxes.append(Bbox.from_extents(cx - radius, cy - radius, cx + radius, cy + radius))
    return boxes


def _shared_area(a: Bbox, b: Bbox, pad: float = 0.0) -> float:
    """The area two boxes share, each grown by ``pad`` pixels (so touching counts as a clash)."""
    wide = min(a.x1, b.x1) - max(a.x0, b.x0) + 2 * pad
    tall = min(a.y1, b.y1) - max(a.y0, b.y0) + 2 * pad
    return max(0.0, wide) * max(0.0, tall)


def _clash(box: Bbox, obstacles: list[Bbox], frame: Bbox) -> float:
    """How badly a label's box sits: the area it shares with the obstacles, plus (ten times) its area outside
    the frame; 0 is a clean spot."""
    outside = box.width * box.height - _shared_area(box, frame)
    return sum(_shared_area(box, o, pad=1.0) for o in obstacles) + 10 * outside


def _alignment(dx: int, dy: int) -> tuple[str, str]:
    """The text's corner or side nearest the bubble, for a number placed in direction (dx, dy) from it."""
    return ("left" if dx > 0 else "right" if dx < 0 else "center",
            "bottom" if dy > 0 else "top" if dy < 0 else "center")


def _number_bubbles(ax, points: PathCollection, count: int) -> list[Annotation]:
    """Number the first ``count`` bubbles beside themselves. Each number tries the eight compass points around
    its bubble, nearest ring first, and takes the first spot whose text box (measured by the renderer, in
    pixels) clears every bubble, every number placed before it and the legend, inside the axes; where none
    does, the spot that overlaps least. A number pushed out of reach of its bubble gets a line to it."""
    renderer = ax.figure.canvas.get_renderer()
    dpi = ax.figure.dpi
    bubbles = _bubble_boxes(points, dpi)
    legend = ax.get_legend()
    obstacles = list(bubbles) + ([legend.get_window_extent(renderer)] if isinstance(legend, Legend) else [])
    frame = ax.bbox
    radii_pt = [b.width / 2 * 72 / dpi for b in bubbles]
    placed = []
    for index in range(count):
        anchor = tuple(points.get_offsets()[index])
        probe = ax.annotate(str(index + 1), anchor, fontsize=8, fontweight="bold", textcoords="offset points",
                            xytext=(0, 0), annotation_clip=False)
        best: tuple[float, float, tuple[float, float], str, str, Bbox] | None = None
        for gap in GAPS_PT:
            for dx, dy in DIRECTIONS:
                reach = (radii_pt[index] + gap) / np.hypot(dx, dy)
                spot = (dx * reach, dy * reach)
                ha, va = _alignment(dx, dy)
                probe.xyann = spot
                probe.set_ha(ha)
                probe.set_va(va)
                box = probe.get_window_extent(renderer)
                clash = _clash(box, obstacles, frame)
                if best is None or clash < best[0]:
                    best = (clash, gap, spot, ha, va, box)
            if best is not None and best[0] == 0:
                break
        probe.remove()
        _, gap, spot, ha, va, box = best
        leader = {"arrowstyle": "-", "lw": 0.6, "color": "0.35", "shrinkA": 1,
                  "shrinkB": radii_pt[index]} if gap > LEADER_GAP_PT else None
        number = ax.annotate(str(index + 1), anchor, fontsize=8, fontweight="bold", textcoords="offset points",
                             xytext=spot, ha=ha, va=va, arrowprops=leader, annotation_clip=False)
        obstacles.append(box)
        placed.append(number)
    return placed


def link_heatmap(report: Report, mode: str | None = None) -> Figure | None:
    """Per torus axis, each chip's utilisation of its links along that axis (mean of both directions) over
    the x-y plane (mean over z), in the steady-state step, every link of the slice (tpusim/report/links.py
    expands the simulated lines by symmetry): one panel per axis, so tensor-parallel rings on x and
    data-parallel traffic on y/z read apart. One shared colour scale."""
    mode = mode or _modes(report)[-1]
    links = report.modes[mode].links
    per_axis = (links.per_chip_axis or [[coord, [u]] for coord, u in links.per_chip]) if links else []
    if not per_axis:
        return None
    dims = report.slice.dims
    axes = [a for a in range(len(per_axis[0][1])) if a >= len(dims) or dims[a] > 1] or [0]
    names = report.slice.axis_names or ["x", "y", "z"]
    depth = int(np.prod(dims[2:])) if len(dims) > 2 else 1
    grids = []
    for axis in axes:
        grid = np.zeros((dims[1] if len(dims) > 1 else 1, dims[0]))
        for coord, utilisation in per_axis:
            grid[coord[1] if len(coord) > 1 else 0, coord[0]] += utilisation[axis]
        grids.append(grid / depth)            # chips with no busy link count as 0
    top = max(1e-9, max(g.max() for g in grids))
    fig = _figure(3.2 * len(grids) + 1, 3.6)
    fig.get_layout_engine().set(h_pad=TITLE_GAP_PT / 72)    # the suptitle stands clear of the panels' titles
    panels = np.atleast_1d(fig.subplots(1, len(grids)))
    for ax, grid, axis in zip(panels, grids, axes):
        image = ax.imshow(grid, origin="lower", cmap="viridis", vmin=0, vmax=top)
        ax.set_title(f"{names[axis] if axis < len(names) else axis} links" if len(per_axis[0][1]) > 1
                     else "all links", fontsize=9)
        ax.set_xlabel("chip x")
        ax.set_ylabel("chip y")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))       # chip coordinates: whole numbers only
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    fig.colorbar(image, ax=list(panels), label="link utilisation")
    fig.suptitle(f"ICI link utilisation ({mode}, steady-state step"
                 f"{'; mean over z' if depth > 1 else ''})", fontsize=10, wrap=True)
    return _settled(fig)


def placement_comparison(report: Report) -> Figure | None:
    """Collective time per DeviceMesh placement (stacked by mesh dim), best first, when compared."""
    ranked = report.placements.ranked if report.placements else []
    if len(ranked) < 2:
        return None
    ranked = ranked[:12]
    dims = sorted({dim for p in ranked for dim in p.by_dim})
    unit, scale = _time_unit(max(p.collective_s for p in ranked) or 1e-9)
    fig = _figure(7, 1.2 + 0.35 * len(ranked))
    ax = fig.subplots()
    labels = [p.placement for p in ranked][::-1]
    left = np.zeros(len(ranked))
    for dim in dims:
        widths = np.array([p.by_dim.get(dim, 0.0) / scale for p in ranked][::-1])
        ax.barh(labels, widths, left=left, label=dim)
        left += widths
    ax.set_xlabel(f"collective time per run ({unit}), by mesh dim")
    ax.set_title("Placements of the DeviceMesh on the torus (best at the top)")
    ax.legend(fontsize=8)
    return _settled(fig)


FIGURES = {"modes": mode_comparison, "breakdown": time_breakdown, "roofline": roofline,
           "links": link_heatmap, "placements": placement_comparison}


def save_figures(report: Report, out_dir: Path) -> dict[str, Path]:
    """Every figure as ``out_dir/<name>.png``, each written atomically (tpusim/output.py); none when no mode
    was priced."""
    from tpusim.output import write_atomic

    paths: dict[str, Path] = {}
    if not report.modes:
        return paths
    for name, draw in FIGURES.items():
        fig = draw(report)
        if fig is None:
            continue
        path = out_dir / f"{name}.png"
        image = io.BytesIO()
        fig.savefig(image, format="png", dpi=DPI, metadata={"Software": None})  # no version stamp: stable bytes
        write_atomic(path, image.getvalue())
        paths[name] = path
    return paths
