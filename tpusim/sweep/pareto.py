"""The Pareto front of a sweep: the points no other point beats on both step time and chips (cost).

A point is on the front when every point with as few chips or fewer is slower (strictly); among points
with the same chips and step time the first listed stands for them.
"""

from __future__ import annotations

from typing import Any


def pareto_flags(chips: list[int | None], step_s: list[float | None]) -> list[bool]:
    """For each point, whether it is on the front (points without a step time never are)."""
    order = sorted((i for i, (c, s) in enumerate(zip(chips, step_s)) if c is not None and s is not None),
                   key=lambda i: (chips[i], step_s[i], i))
    flags = [False] * len(chips)
    best = float("inf")
    for i in order:
        if step_s[i] < best:
            flags[i] = True
            best = step_s[i]
    return flags


def pareto_front(table: Any) -> Any:
    """The front rows of a sweep DataFrame (status ok), by chips then step time; a table with its ``pareto``
    column (sweep_table's: one front per combination of script arguments) is read, not recomputed."""
    ok = table[table["status"] == "ok"]
    if "pareto" in ok:
        return ok[ok["pareto"].astype(bool)].sort_values(["chips", "step_time_s"])
    flags = pareto_flags([int(c) for c in ok["chips"]], [float(s) for s in ok["step_time_s"]])
    return ok[flags].sort_values(["chips", "step_time_s"])
