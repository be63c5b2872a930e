"""The lines `tpusim run` prints after its summary about placement: the --ranks one caveat, the ranking of
placements and why the best one wins."""

from __future__ import annotations

from tpusim.placement import Distributed, PlacementComparison
from tpusim.placement.text import fmt_seconds


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
