"""The record budget under ``--ranks all``: each rank's recorder stops on its own budget
(tpusim/backend/program_trace/recorder.py); the rank's process writes where it stopped next to its trace
(``write_stop``), and the merge (runner.record_all) cuts every rank's trace to what all of them recorded
(``cut_to_step``) and carries one note saying which ranks stopped where (``merged_stop``).

Why cut: ranks stop at their own record counts, so one rank's trace can hold a step (and its collectives)
another's lacks; priced together, those collectives would wait for peers that never call them.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tpusim.trace.records import StepMarker, Trace

if TYPE_CHECKING:       # tpusim.report takes most of a second to import: not in every rank's process
    from tpusim.report.model import RankStopped, RecordingStopped


def stop_path(trace_path: str | Path) -> Path:
    """Where a rank's process writes its budget stop: beside its trace (rank1.jsonl -> rank1.budget.json)."""
    path = Path(trace_path)
    return path.with_name(f"{path.stem}.budget.json")


def write_stop(trace_path: str | Path, rank: int, after_step: int, steps: int, records: int,
               max_records: int) -> None:
    """The rank's stop, for ``read_stops`` (a rank the budget did not stop writes nothing)."""
    stop = {"rank": rank, "after_step": after_step, "steps": steps, "records": records, "max_records": max_records}
    stop_path(trace_path).write_text(json.dumps(stop))


def read_stops(trace_paths: Sequence[Path]) -> tuple[list[RankStopped], int]:
    """The stops the ranks wrote (by rank) and their budget (0 when none stopped)."""
    from tpusim.report.model import RankStopped

    stops, budget = [], 0
    for trace_path in trace_paths:
        path = stop_path(trace_path)
        if path.is_file():
            data = json.loads(path.read_text())
            budget = data.pop("max_records")
            stops.append(RankStopped(**data))
    return sorted(stops, key=lambda s: s.rank), budget


def cut_to_step(trace: Trace, step: int) -> Trace:
    """``trace`` up to and with its ``step``-th StepMarker (step 0: before its first), all of it if it has fewer."""
    markers = 0
    for i, record in enumerate(trace.records):
        if isinstance(record, StepMarker):
            if markers == step:
                return dataclasses.replace(trace, records=trace.records[:i])
            markers += 1
            if markers == step:
                return dataclasses.replace(trace, records=trace.records[:i + 1])
    return trace


def merged_stop(stops: Sequence[RankStopped], after_step: int, steps: int, max_records: int,
                records: int) -> RecordingStopped:
    """report.json's ``recording_stopped`` for the merged trace: priced to ``after_step`` on every rank."""
    from tpusim.report.model import RecordingStopped

    where = ", ".join(f"rank {s.rank} after " + (f"step {s.after_step} of {s.steps}" if s.after_step
                                                  else f"{s.records:,} records, before its first step")
                      for s in stops)
    priced = (f"every rank is priced to step {after_step} of {steps}" if after_step else
              "every rank is priced up to its first step and the collectives all ranks reached: a prefix of "
              "the program, not the whole program")
    note = (f"recording stopped on {where}; {priced} (record budget {max_records:,} records a rank; raise it "
            f"with TPUSIM_MAX_RECORDS or tpusim run --max-records, 0 for no limit)")
    return RecordingStopped(after_step, steps, max_records, note, records, tuple(stops))
