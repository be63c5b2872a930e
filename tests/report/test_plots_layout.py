"""The report's figures fit their own edges, checked by pixel bounds, not by eye (issue 45, item 7): each figure
is saved as save_figures saves it, and every drawn text (titles, axis labels, tick labels, colour-bar label,
annotations, the list beside the roofline) must lie inside the figure's box in the renderer's pixels; the
heat map's title stands clear of its panels' titles; no number on the roofline sits on any bubble, the
bubbles' boxes taken from their path collection (marker path, size transforms, offsets) in display pixels.

The cases that failed before: the three-panel heat map ("chip x" 4 px under the bottom edge: constrained
layout was run once, before the square panels had their size), a one-panel map whose title is wider than the
figure, a long chip name in the roofline's title, and numbers on the roofline's bubbles (the largest bubble
covered its own "1"; clustered ops covered each other's numbers).
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from matplotlib.collections import PathCollection
from matplotlib.figure import Figure
from matplotlib.image import imread
from matplotlib.text import Annotation, Text
from matplotlib.transforms import Affine2D, Bbox
from test_report_page import mixed_trace

from tpusim.eager.modes import get_mode
from tpusim.pricing import price
from tpusim.report import RunInfo, build_report, plots
from tpusim.report.schema import Report, TopOp
from tpusim.slice.topology import build_slice

TOLERANCE_PX = 0.5       # anti-aliasing: a glyph's box may touch the edge, not cross it


@pytest.fixture(scope="module")
def report() -> Report:
    trace, slice_ = mixed_trace(), build_slice("2d:2x2", "v5e")
    timelines = {mode: price(trace, topology=slice_, mode=get_mode(mode)) for mode in ("strict", "fused")}
    return build_report(RunInfo("train.py", topology="2d:2x2"), trace, slice_, timelines)


def _saved(fig: Figure) -> Figure:
    """Save the figure as save_figures does; the renderer it leaves behind measured what went into the PNG."""
    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=plots.DPI)
    image.seek(0)
    height, width = imread(image).shape[:2]
    assert (width, height) == (round(fig.bbox.width), round(fig.bbox.height))   # the box below is the image
    return fig


def _drawn_texts(fig: Figure) -> list[Text]:
    """Every text drawn: titles, axis and colour-bar labels, annotations, legend entries, and the tick labels
    of ticks inside the view (a locator's ticks past the limits are not drawn)."""
    undrawn = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            low, high = sorted(axis.get_view_interval())
            slack = 1e-9 * max(1.0, abs(low), abs(high))
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                if not low - slack <= tick.get_loc() <= high + slack:
                    undrawn |= {id(tick.label1), id(tick.label2)}
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text() and id(t) not in undrawn]


def _outside(fig: Figure) -> list[str]:
    renderer, edge = fig.canvas.get_renderer(), fig.bbox
    out = []
    for text in _drawn_texts(fig):
        box = Text.get_window_extent(text, renderer)
        if (box.x0 < edge.x0 - TOLERANCE_PX or box.y0 < edge.y0 - TOLERANCE_PX or box.x1 > edge.x1 + TOLERANCE_PX
                or box.y1 > edge.y1 + TOLERANCE_PX):
            out.append(f"{text.get_text()[:40]!r} at {np.round(box.extents, 1).tolist()} outside "
                       f"{np.round(edge.extents, 1).tolist()}")
    return out


def _with_links(report: Report, dims: list[int]) -> Report:
    """The report's run as if on a slice of ``dims``: every chip's links busy on every axis, by axis number."""
    slice_ = report.slice.model_copy(update={"dims": dims, "chips": int(np.prod(dims))})
    coords = [list(c) for c in np.ndindex(*dims)]
    mode = report.modes["fused"]
    links = mode.links.model_copy(update={"per_chip_axis": [[c, [0.2 * (a + 1) for a in range(len(dims))]]
                                                            for c in coords]})
    modes = {**report.modes, "fused": mode.model_copy(update={"links": links})}
    return report.model_copy(update={"slice": slice_, "modes": modes})


@pytest.mark.parametrize("name", list(plots.FIGURES))
def test_every_figure_of_a_run_keeps_its_text_inside(report: Report, name: str) -> None:
    fig = plots.FIGURES[name](report)
    if fig is None:
        pytest.skip(f"this run draws no {name} figure")
    assert _outside(_saved(fig)) == []


@pytest.mark.parametrize("dims", [[4, 4, 4], [8, 16], [1, 1, 4], [32, 32]],
                         ids=["three-panels", "two-panels-wide", "one-panel-long-title", "many-ticks"])
def test_the_link_heat_map_keeps_labels_and_title_inside(report: Report, dims: list[int]) -> None:
    fig = _saved(plots.link_heatmap(_with_links(report, dims)))
    assert _outside(fig) == []
    labels = [ax.xaxis.label.get_text() for ax in fig.axes[:-1]]
    assert labels and set(labels) == {"chip x"}                 # the label that was cut is drawn, whole


@pytest.mark.parametrize("dims", [[2, 2], [4, 4, 4]])
def test_the_heat_map_title_stands_clear_of_the_panel_titles(report: Report, dims: list[int]) -> None:
    """At least a panel title's height between the figure's title and each panel's (it was 9 px of 14)."""
    fig = _saved(plots.link_heatmap(_with_links(report, dims)))
    renderer = fig.canvas.get_renderer()
    (title,) = [t.get_window_extent(renderer) for t in fig.texts if t.get_text() == fig.get_suptitle() != ""]
    for ax in fig.axes[:-1]:
        panel = ax.title.get_window_extent(renderer)
        assert title.y0 - panel.y1 >= panel.height, (ax.title.get_text(), title.y0 - panel.y1, panel.height)


def _bubbles(points: PathCollection) -> list[Bbox]:
    """Each bubble's extent in display pixels, from the collection itself: the marker path scaled by each
    size's transform (set at draw time for the figure's dpi), moved to its offset."""
    path = points.get_paths()[0]
    centres = points.get_offset_transform().transform(points.get_offsets())
    scales = points.get_transforms()
    scales = np.broadcast_to(scales, (len(centres), 3, 3)) if len(scales) == 1 else scales
    return [path.transformed(Affine2D(scale).translate(*centre)).get_extents()
            for scale, centre in zip(scales, centres)]


def _overlap(a: Bbox, b: Bbox) -> bool:
    return min(a.x1, b.x1) - max(a.x0, b.x0) > 0 and min(a.y1, b.y1) - max(a.y0, b.y0) > 0


def _roofline_clashes(fig: Figure) -> list[str]:
    ax = fig.axes[0]
    renderer = fig.canvas.get_renderer()
    (points,) = [c for c in ax.collections if isinstance(c, PathCollection)]
    bubbles = _bubbles(points)
    numbers = [t for t in ax.texts if isinstance(t, Annotation) and t.get_text().isdigit()]
    assert numbers, "the costliest ops are numbered"
    boxes = [Text.get_window_extent(n, renderer) for n in numbers]          # the text, not its leader line
    clashes = [f"number {n.get_text()} on bubble {i + 1}" for n, box in zip(numbers, boxes)
               for i, bubble in enumerate(bubbles) if _overlap(box, bubble)]
    clashes += [f"numbers {a.get_text()} and {b.get_text()} overlap" for i, (a, box) in enumerate(zip(numbers, boxes))
                for b, other in zip(numbers[i + 1:], boxes[i + 1:]) if _overlap(box, other)]
    offsets = points.get_offsets()
    for number in numbers:                    # each number points at its own op's bubble
        assert tuple(number.xy) == pytest.approx(tuple(offsets[int(number.get_text()) - 1]))
    return clashes


def _op(name: str, intensity: float, tflops: float, seconds: float) -> TopOp:
    flops = tflops * 1e12 * seconds
    return TopOp(op=f"aten::{name}", source="train.py:1", count=1, seconds=seconds, flops=flops,
                 bytes=flops / intensity, bound="mxu", dtype="bfloat16")


def _with_ops(report: Report, ops: list[TopOp], display_name: str | None = None) -> Report:
    mode = report.modes["fused"].model_copy(update={"top_ops": ops})
    chip = report.chip.model_copy(update={"display_name": display_name or report.chip.display_name})
    return report.model_copy(update={"modes": {**report.modes, "fused": mode}, "chip": chip})


CLUSTERED = [_op("mm", 100, 60, 4e-3), _op("bmm", 110, 62, 3e-3), _op("addmm", 95, 58, 3e-3),
             _op("conv", 105, 55, 2e-3), _op("baddbmm", 120, 64, 2e-3), _op("linear", 90, 61, 1e-3),
             _op("mul", 98, 57, 5e-4), _op("add", 115, 59, 5e-4)]


def test_the_run_s_roofline_numbers_sit_beside_their_bubbles(report: Report) -> None:
    assert _roofline_clashes(_saved(plots.roofline(report))) == []


def test_clustered_ops_numbers_clear_every_bubble_and_each_other(report: Report) -> None:
    fig = _saved(plots.roofline(_with_ops(report, CLUSTERED)))
    assert _roofline_clashes(fig) == []
    assert _outside(fig) == []


def test_a_long_chip_name_keeps_the_roofline_title_inside(report: Report) -> None:
    name = "TPU v5 lite (v5litepod, calibrated against the MLPerf Training 4.0 and Inference 4.1 submissions)"
    fig = _saved(plots.roofline(_with_ops(report, CLUSTERED[:3], display_name=name)))
    assert _outside(fig) == []
    assert _roofline_clashes(fig) == []
