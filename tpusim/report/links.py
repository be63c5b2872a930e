"""The ICI link tables and heat map of a mode: every link of the slice, over the steady-state step.

Why a module of its own: the simulator prices a collective on one representative line per axis (SPMD
symmetry, tpusim/collectives), so its LinkStats hold only those lines' channels; drawn as they are, only
row y=0 and column x=0 of the heat map lit up while every tensor-parallel ring was equally busy. Here
each simulated one-way channel stands for its translates: a channel's class is (slice, axis, direction,
its position along that axis), and under symmetry every link of the slice in the same class carries the
same traffic. Channels that were simulated themselves (MPMD runs, lines a fault touches) keep their own
figures; only the missing ones are filled in.

Utilisation is busy time over the steady-state window (tpusim/report/steps.py), not the whole program,
whose length is mostly compile estimates and warm-up. A channel's busy spans inside the window are exact
where the network kept them (the busiest few); for the others the channel's busy time is scaled by the
share of collective time that fell inside the window (every step runs the same collectives).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from typing import Any

from tpusim.network.links import channel_name
from tpusim.pricing.timeline import Timeline

BUSIEST_LISTED = 10
DCN_AXES_FROM = 3      # axis numbers from 3 up are DCN channels: no torus symmetry to expand by


def _overlap(spans: tuple[tuple[float, float], ...], start: float, end: float) -> float:
    return sum(max(0.0, min(e, end) - max(s, start)) for s, e in spans)


def collective_share(timeline: Timeline, start: float, end: float) -> float:
    """The share of the program's collective time (per run, summed) that fell inside [start, end)."""
    total = sum(r.end_s - r.start_s for r in timeline.collectives)
    inside = sum(max(0.0, min(r.end_s, end) - max(r.start_s, start)) for r in timeline.collectives)
    return inside / total if total else 0.0


def steady_channels(timeline: Timeline, start: float, end: float) -> dict[tuple, tuple[float, float]]:
    """Simulated channel key -> (utilisation over [start, end), bytes per window) for channels that moved bytes."""
    stats = timeline.link_stats
    window = end - start
    if stats is None or window <= 0:
        return {}
    share = collective_share(timeline, start, end)
    found = {}
    for channel in stats.channels:
        if channel.busy_s <= 0:
            continue
        busy = _overlap(channel.intervals, start, end) if channel.intervals else channel.busy_s * share
        found[channel.key] = (min(1.0, busy / window), channel.bytes * share)
    return found


def expand_by_symmetry(channels: dict[tuple, tuple[float, float]], dims: tuple[int, ...]
                       ) -> dict[tuple, tuple[float, float]]:
    """Every torus channel of the slice whose class (see the module docstring) has a simulated member: the
    class's mean; simulated channels keep their own figures."""
    classes: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    for (s, coord, axis, direction), value in channels.items():
        if axis < DCN_AXES_FROM:
            classes[(s, axis, direction, coord[axis])].append(value)
    expanded = dict(channels)
    for (s, axis, direction, position), values in classes.items():
        mean = (sum(u for u, _ in values) / len(values), sum(b for _, b in values) / len(values))
        ranges = [range(n) if a != axis else (position,) for a, n in enumerate(dims)]
        for coord in itertools.product(*ranges):
            expanded.setdefault((s, coord, axis, direction), mean)
    return expanded


def link_summary(timeline: Timeline, dims: tuple[int, ...], start: float, end: float) -> dict[str, Any]:
    """report.json ``modes.<mode>.links``: the busiest links, counts and each chip's mean outgoing-link
    utilisation (the heat map), over the whole slice and the window [start, end)."""
    simulated = steady_channels(timeline, start, end)
    channels = expand_by_symmetry(simulated, dims) if timeline.symmetric else simulated
    busy = {key: value for key, value in channels.items() if value[0] > 0}
    if not busy:
        return {"max_utilisation": 0.0, "mean_utilisation": 0.0, "busy_links": 0, "simulated_links": 0,
                "window_s": end - start, "busiest": [], "per_chip": [], "per_chip_axis": []}
    per_chip: dict[tuple[int, ...], list[float]] = defaultdict(list)
    per_axis: dict[tuple[int, ...], list[float]] = defaultdict(lambda: [0.0] * len(dims))
    for (_, coord, axis, _), (utilisation, _) in busy.items():
        if axis < DCN_AXES_FROM:
            per_chip[tuple(coord)].append(utilisation)
            per_axis[tuple(coord)][axis] += utilisation / 2      # the mean of the axis' two directions
    ranked = sorted(busy.items(), key=lambda item: (-item[1][0], channel_name(item[0])))
    return {"max_utilisation": ranked[0][1][0],
            "mean_utilisation": sum(u for u, _ in busy.values()) / len(busy),
            "busy_links": len(busy), "simulated_links": sum(1 for k in busy if k in simulated),
            "window_s": end - start,
            "busiest": [{"link": channel_name(key), "utilisation": u, "bytes": b, "simulated": key in simulated}
                        for key, (u, b) in ranked[:BUSIEST_LISTED]],
            "per_chip": [[list(coord), sum(u) / len(u)] for coord, u in sorted(per_chip.items())],
            "per_chip_axis": [[list(coord), u] for coord, u in sorted(per_axis.items())]}
