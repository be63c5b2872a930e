"""trace.json: a Timeline in Chrome trace-event format, for ui.perfetto.dev or chrome://tracing.

One eager mode (the fastest; its name in every process name and in otherData.note), one process per
simulated chip (under SPMD symmetry chip 0 stands for all, and says so), one thread per track: host,
tensorcore, sparsecore, ici (collectives as the chip sees them), pcie; plus an "ICI links" process with one track per
busy one-way link (the busiest 16) showing when it moved bytes. Each event's args carry op name, bytes, FLOPs,
what bound it and the user's source line.
"""

from __future__ import annotations

from typing import Any

from tpusim.pricing.timeline import TRACKS, Timeline
from tpusim.report.text import percent_text, seconds_text

LINKS_PID = 1_000_000  # the "ICI links" process, after every chip's


def link_events(timeline: Timeline) -> list[dict[str, Any]]:
    """One track per busy ICI channel (the busiest few), one event per busy span. A collective
    fast-forwarded from the memo shows as one span of its bytes' busy time from its start."""
    stats = timeline.link_stats
    traced = [c for c in (stats.channels if stats is not None else ()) if c.intervals]
    if not traced:
        return []
    events = [{"ph": "M", "name": "process_name", "pid": LINKS_PID, "tid": 0,
               "args": {"name": "ICI links (busiest)"}}]
    for tid, channel in enumerate(traced):
        events.append({"ph": "M", "name": "thread_name", "pid": LINKS_PID, "tid": tid,
                       "args": {"name": f"{channel.name} ({seconds_text(channel.busy_s)}, "
                                        f"{percent_text(channel.utilisation)} of the program busy)"}})
        events += [{"ph": "X", "name": "busy", "cat": "ici", "pid": LINKS_PID, "tid": tid, "ts": start * 1e6,
                    "dur": max((end - start) * 1e6, 1e-3), "args": {"link": channel.name}}
                   for start, end in channel.intervals]
    return events


def perfetto_trace(timeline: Timeline, mode: str) -> dict[str, Any]:
    events: list[dict[str, Any]] = []
    stands_for = (f"; stands for all {timeline.world_size} chips by symmetry"
                  if timeline.symmetric and timeline.world_size > 1 else "")
    for chip in timeline.chips_simulated:
        events.append({"ph": "M", "name": "process_name", "pid": chip, "tid": 0,
                       "args": {"name": f"chip {chip} ({mode} mode{stands_for})"}})
        for tid, track in enumerate(TRACKS):
            events.append({"ph": "M", "name": "thread_name", "pid": chip, "tid": tid, "args": {"name": track}})
    for event in timeline.events:
        args: dict[str, Any] = {"kind": event.kind}
        for key in ("bytes", "flops"):
            if getattr(event, key):
                args[key] = getattr(event, key)
        if event.bound:
            args["bound"] = event.bound
        if event.source:
            args["source"] = event.source
        events.append({"ph": "X", "name": event.name, "cat": event.kind, "pid": event.chip,
                       "tid": TRACKS.index(event.track) if event.track in TRACKS else len(TRACKS),
                       "ts": event.start_s * 1e6, "dur": max(event.seconds * 1e6, 1e-3), "args": args})
    events += link_events(timeline)
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"tool": "tpusim", "mode": mode, "policy": timeline.policy,
                          "note": f"one eager mode ({mode}, the fastest priced; report.json has every mode); "
                                  f"chips simulated: {', '.join(map(str, timeline.chips_simulated))}{stands_for}; "
                                  f"a link track's busy share is over the whole program (report.html's link "
                                  f"table and heat map: the steady-state step)"}}
