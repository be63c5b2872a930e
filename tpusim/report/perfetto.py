"""trace.json: a Timeline in Chrome trace-event format, for ui.perfetto.dev or chrome://tracing.

One process per simulated chip (plus one for the ICI network), one thread per track:
host, tensorcore, sparsecore, ici, pcie. Each event's args carry op name, bytes, FLOPs,
what bound it and the user's source line.
"""

from __future__ import annotations

from typing import Any

from tpusim.engine import TRACKS, Timeline


def perfetto_trace(timeline: Timeline, mode: str) -> dict[str, Any]:
    events: list[dict[str, Any]] = []
    for chip in timeline.chips_simulated:
        events.append({"ph": "M", "name": "process_name", "pid": chip, "tid": 0,
                       "args": {"name": f"chip {chip} ({mode})"}})
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
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"tool": "tpusim", "mode": mode, "policy": timeline.policy}}
