"""The Pareto fronts of a sweep: the points no other point beats on both step time and chips (cost), and
for an inference program the serving front: the points no other point beats on both tokens/s per chip
(throughput) and time per output token (latency).

A point is on the front when every point with as few chips or fewer is slower (strictly); among points
with the same chips and step time the first listed stands for them. Likewise on the serving front: every
point with as low a TPOT or lower has strictly fewer tokens/s.
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


def serving_flags(tpot_s: list[float | None], tokens_per_s: list[float | None]) -> list[bool]:
    """For each point, whether it is on the throughput-latency front (points without both never are): a
    bigger batch buys tokens/s with a longer step, and the front is where no point is both faster and busier."""
    order = sorted((i for i, (t, r) in enumerate(zip(tpot_s, tokens_per_s)) if t is not None and r is not None),
                   key=lambda i: (-tokens_per_s[i], tpot_s[i], i))
    flags = [False] * len(tpot_s)
    best = float("inf")
    for i in order:                 # by throughput, highest first: on the front when faster than every busier one
        if tpot_s[i] < best:
            flags[i] = True
            best = tpot_s[i]
    return flags


def serving_front(table: Any) -> Any:
    """The serving front rows (``serving_pareto``) by chip, topology, slices, then time per output token."""
    if "serving_pareto" not in table:
        return table.iloc[0:0]
    front = table[(table["status"] == "ok") & table["serving_pareto"].astype(bool)]
    return front.sort_values(["chip", "topology", "slices", "tpot_median_s"])
