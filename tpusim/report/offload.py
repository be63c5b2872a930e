"""modes.<mode>.offload: activations kept on the host (save_on_cpu, saved_tensors_hooks, non_blocking copies).

Why a section of its own: an offload trades HBM for traffic on the chip's host link, and whether that trade is
free depends on the mode: a non_blocking copy runs on PCIe beside compute (tpusim/pricing/engine.py), a blocking
one stalls the host. The section says what left HBM and came back (bytes each way, as recorded: the
``d2h`` copies with reason ``offload`` and the ``h2d`` copies of the host buffers they filled), the host memory
the offloaded tensors held at most (``TraceMeta.host_peak_bytes``, counted while recording), and the PCIe time
of the mode: the link's whole busy time and the part compute did not hide (blocking copies, a device waiting
for a copy). Per chip; absent when the program offloaded nothing.
"""

from __future__ import annotations

from typing import Any

from tpusim.pricing.timeline import Timeline
from tpusim.trace.records import OFFLOAD_REASON, HostRecord, Trace


def offload_section(timeline: Timeline, trace: Trace) -> dict[str, Any] | None:
    """The mode's offload figures (report.json's modes.<mode>.offload), or None when nothing was offloaded."""
    copies = [r for r in trace.records if isinstance(r, HostRecord) and r.event in ("d2h", "h2d")]
    offloads = [r for r in copies if r.event == "d2h" and r.reason == OFFLOAD_REASON]
    if not offloads:
        return None
    filled = {(r.rank, r.host) for r in offloads if r.host}
    reloads = [r for r in copies if r.event == "h2d" and (r.rank, r.host) in filled]
    chips = max(1, len(timeline.chips_simulated))
    ranks = max(1, len({r.rank for r in offloads}))
    return {
        "host_peak_bytes": trace.meta.host_peak_bytes or 0,
        "d2h_bytes": sum(r.bytes for r in offloads) / ranks,
        "h2d_bytes": sum(r.bytes for r in reloads) / ranks,
        "d2h_copies": len(offloads) // ranks,
        "h2d_copies": len(reloads) // ranks,
        "pcie_s": sum(e.seconds for e in timeline.events if e.track == "pcie") / chips,
        "pcie_exposed_s": pcie_exposed_s(timeline) / chips,
    }


def pcie_exposed_s(timeline: Timeline) -> float:
    """PCIe time compute did not hide, over all chips: blocking copies (the host waits through them, the device
    has drained) and the device's waits for a non_blocking copy (``wait`` events bound ``pcie``)."""
    blocking = sum(e.seconds for e in timeline.events if e.track == "host" and e.kind == "transfer")
    waits = sum(e.seconds for e in timeline.events if e.kind == "wait" and e.bound == "pcie")
    return blocking + waits


def offload_entry(timeline: Timeline, trace: Trace) -> dict[str, Any]:
    """``{"offload": section}`` for a mode's dict, or nothing: a run that offloaded nothing keeps its report as
    before (the key absent, not null)."""
    section = offload_section(timeline, trace)
    return {} if section is None else {"offload": section}
