"""The collectives of a mode, grouped: one row per (kind, group, bytes, source line) with its count and totals.

Why: a training step issues the same all-gather once per layer, so a call-by-call list read 64 rows of
the same all-gather; what a reader needs is which call site costs how much in all. Times below the
simulator's resolution (contention on an idle network) are 0 (tpusim/report/text.py).
"""

from __future__ import annotations

from typing import Any

from tpusim.pricing.timeline import CollectiveRun
from tpusim.report.text import resolved


def collective_entry(run: CollectiveRun) -> dict[str, Any]:
    """report.json ``modes.<mode>.collectives[]``: one call as it ran."""
    result = run.result
    time_s = run.end_s - run.start_s
    return {"seq": run.seq, "kind": run.kind, "bytes": result.bytes, "rank_bytes": run.rank_bytes,
            "group_size": run.group_size, "axes": list(result.axes), "algorithm": result.algorithm,
            "reason": result.reason, "time_s": time_s, "closed_form_s": result.closed_form_s,
            "contention_s": resolved(result.contention_s, time_s), "async": run.async_op, "source": run.source}


def group_collectives(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """report.json ``modes.<mode>.collective_groups[]``: calls with the same kind, group size, axes, bytes and
    source line, counted and summed; most total time first."""
    groups: dict[tuple, dict[str, Any]] = {}
    for call in calls:
        key = (call["kind"], call["group_size"], tuple(call["axes"]), call["bytes"], call["source"])
        group = groups.get(key)
        if group is None:
            group = groups[key] = {"kind": call["kind"], "group_size": call["group_size"], "axes": call["axes"],
                                   "bytes": call["bytes"], "source": call["source"], "count": 0,
                                   "algorithms": [], "total_s": 0.0, "closed_form_total_s": 0.0,
                                   "contention_total_s": 0.0, "total_bytes": 0}
        group["count"] += 1
        group["total_s"] += call["time_s"]
        group["closed_form_total_s"] += call["closed_form_s"]
        group["contention_total_s"] += call["contention_s"]
        group["total_bytes"] += call["bytes"]
        if call["algorithm"] not in group["algorithms"]:
            group["algorithms"].append(call["algorithm"])
    rows = list(groups.values())
    for row in rows:
        row["contention_total_s"] = resolved(row["contention_total_s"], row["total_s"])
    rows.sort(key=lambda r: (-r["total_s"], r["kind"], r["source"], r["bytes"]))
    return rows
