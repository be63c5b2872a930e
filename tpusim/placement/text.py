"""Placement in words: how a mesh dim's chips sit on the torus, and the lines `tpusim run` prints after its
summary (the --ranks one caveat, the ranking and why the best placement wins)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpusim.topology import AXIS_NAMES, Slice

if TYPE_CHECKING:
    from tpusim.placement.compare import PlacementComparison
    from tpusim.placement.distributed import Distributed
    from tpusim.placement.mesh import Segment


def describe_segments(segs: tuple[Segment, ...], slice_: Slice) -> str:
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


def format_placements(distributed: Distributed | None, comparison: PlacementComparison | None) -> str:
    """Lines for the terminal after the summary: the --ranks one caveat, the ranking and why the best wins
    ('' without either)."""
    lines = []
    if distributed and distributed.ranks == "one" and distributed.not_reference_correct:
        kinds = sorted({e.kind for e in distributed.not_reference_correct})
        lines.append(f"--ranks one: values after {', '.join(kinds)} follow the symmetry rule and are not "
                     f"reference-correct (report.json: distributed)")
    if comparison and comparison.ranked:
        lines.append("placements (ranked by step time):")
        for i, p in enumerate(comparison.ranked, 1):
            lines.append(f"  {i}. {p.placement:<28} step {fmt_seconds(p.step_s):>10}  collectives "
                         f"{fmt_seconds(p.collective_s):>10}")
        lines.append(f"  {comparison.reason}")
    elif comparison:
        lines.append(f"placements: {comparison.reason}")
    return "".join(line + "\n" for line in lines)
