"""modes.<mode>.dcn: the collectives that cross slices over DCN, in a multislice run (``--slices N``).

Why a section of its own: DCN between slices is an order of magnitude slower than ICI inside one, so a
multislice run's first question is how much of the step its cross-slice collectives take and whether compute
hides them. A collective is a DCN one when its group spans slices (its axes include ``dcn``: the network
then runs ICI stages inside each slice around one DCN stage, tpusim/network/collectives/dcn.py). Per chip:
how many ran, the bytes of their buffers (as recorded), their time, and the part no compute hid (the
device's waits on them); ``step_exposed_s`` is that part per steady-state step, which the headline's bound
reads. Absent on a single slice.
"""

from __future__ import annotations

from typing import Any

from tpusim.network.collectives.groups import DCN_NAME
from tpusim.pricing.timeline import Timeline
from tpusim.report.steps import Steps
from tpusim.slice.topology import Slice


def dcn_exposed_s(timeline: Timeline, start: float, end: float) -> float:
    """Device time in [start, end), over all chips, spent waiting on collectives whose group spans slices."""
    crossing = {(run.chip, run.seq) for run in timeline.collectives if DCN_NAME in run.result.axes}
    return sum(max(0.0, min(e.end_s, end) - max(e.start_s, start)) for e in timeline.events
               if e.kind == "wait" and e.bound == "collective" and (e.chip, e.seq) in crossing)


def dcn_section(timeline: Timeline, slice_: Slice, steps: Steps) -> dict[str, Any] | None:
    """The mode's DCN figures (report.json's modes.<mode>.dcn), or None on a single slice."""
    if slice_.num_slices < 2:
        return None
    chips = max(1, len(timeline.chips_simulated))
    runs = [run for run in timeline.collectives if DCN_NAME in run.result.axes]
    steady = (dcn_exposed_s(timeline, steps.steady_start_s, steps.steady_end_s) / chips / steps.steady
              if steps.count and steps.steady else None)
    return {
        "slices": slice_.num_slices,
        "collectives": len(runs) // chips,
        "bytes": sum(run.rank_bytes for run in runs) / chips,
        "time_s": sum(run.end_s - run.start_s for run in runs) / chips,
        "exposed_s": dcn_exposed_s(timeline, 0.0, timeline.total_s) / chips,
        "step_exposed_s": steady,
        "dcn_bytes_per_s": slice_.chip.dcn_bytes_per_s,
    }


def dcn_entry(timeline: Timeline, slice_: Slice, steps: Steps) -> dict[str, Any]:
    """``{"dcn": section}`` for a mode's dict, or nothing: a single-slice report keeps its keys as before."""
    section = dcn_section(timeline, slice_, steps)
    return {} if section is None else {"dcn": section}
