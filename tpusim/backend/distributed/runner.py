"""What ``tpusim run`` calls for distributed scripts: choose --ranks, set the env, record every rank.

``--ranks auto`` (the default) runs every rank as its own process (``all``) when the slice has
2..16 chips and the script uses torch.distributed; otherwise one process plays rank 0 (``one``).
The rank processes get this process's device config (``DeviceConfig.env()``: one variable).
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from tpusim.backend.distributed import budget, install
from tpusim.backend.distributed.env import torchrun_env
from tpusim.backend.distributed.launcher import LaunchResult, launch
from tpusim.backend.plumbing.state import STATE
from tpusim.errors import TpusimError
from tpusim.script import STOP_SIGNALS, ScriptOutcome
from tpusim.trace.records import CollectiveRecord, StepMarker, Trace, TraceMeta, read_trace, renumber

if TYPE_CHECKING:
    from tpusim.report.model import RecordingStopped

MAX_ALL = 16
_USES_DIST = re.compile(r"torch\.distributed|init_process_group|DistributedDataParallel|fully_shard|DeviceMesh|"
                        r"init_device_mesh")


def resolve_ranks(requested: str, chips: int, script: Path) -> str:
    """'one' or 'all' for ``--ranks`` (auto: see the module docstring)."""
    if requested == "auto":
        uses = bool(_USES_DIST.search(script.read_text(errors="replace")))
        return "all" if 2 <= chips <= MAX_ALL and uses else "one"
    if requested == "all" and chips > 64:
        raise TpusimError(f"--ranks all starts one process per chip; {chips} chips is too many for one "
                          f"machine: use --ranks one (rank 0 of the full world, priced by symmetry)")
    return requested


def prepare_one(world: int, chips_per_host: int) -> None:
    """--ranks one: this process is rank 0 of ``world`` (torchrun's variables; no rendezvous needed)."""
    os.environ.update(torchrun_env(0, world, chips_per_host, "one", 29500))
    install()                               # the "tpusim" backend and the launch-time patches


def record_all(script: Path, argv: list[str], world: int, chips_per_host: int, ranks_dir: Path,
               max_records: int | None = None) -> tuple[Trace, ScriptOutcome, RecordingStopped | None]:
    """--ranks all: one process per rank, each with this process's device config (and ``max_records``, the
    record budget, when given), each writing its trace into ``ranks_dir``; their traces merged into one
    multi-rank trace, with where the budget stopped the ranks (budget.py), if it did."""
    env = STATE.config.env() | ({} if max_records is None else {"TPUSIM_MAX_RECORDS": str(max_records)})
    result = launch(script, argv, world, chips_per_host, ranks_dir, env=env)
    present = [p for p in result.traces if p.is_file()]
    traces = [read_trace(p) for p in present]
    stops, rank_budget = budget.read_stops(present)
    stopped = None
    if stops:                               # priced to the step every rank recorded (budget.py: why)
        steps = max([s.steps for s in stops] + [sum(isinstance(r, StepMarker) for r in t.records) for t in traces])
        after_step = min(s.after_step for s in stops)
        traces = [budget.cut_to_step(t, after_step) for t in traces]
    dropped = 0
    if not result.ok or stops:              # stopped part-way: price the collectives every rank reached
        traces, dropped = common_prefix(traces, world)
    records = [r for t in traces for r in t.records]
    if stops:
        stopped = budget.merged_stop(stops, after_step, steps, rank_budget, len(records))
    meta = (traces[0].meta if traces else TraceMeta()).replace(ranks="all",
                                                                ranks_recorded=tuple(t.rank for t in traces))
    trace = Trace(records=renumber(records), world_size=world, rank=0, meta=meta)
    if result.ok:
        return trace, ScriptOutcome(exit_code=0), stopped
    summary = result.summary()
    if dropped:
        summary += (f"\n(the report covers what every rank reached: {dropped} records after the last collective "
                    f"all ranks called are left out)")
    if result.interrupted:                  # reported as Ctrl-C (or SIGTERM, SIGHUP) during the script: 128 + signal
        by = STOP_SIGNALS.get(result.signal, "KeyboardInterrupt")
        return trace, ScriptOutcome(exit_code=128 + result.signal, error=summary + "\n", error_type=by), stopped
    kind = _crash_type(result) or ("CollectiveMismatchError" if result.diagnosis else "RankCrashed")
    code = max((c for c in result.exit_codes if c > 0), default=1)
    return trace, ScriptOutcome(exit_code=code, error=summary + "\n", error_type=kind), stopped


def common_prefix(traces: list[Trace], world: int) -> tuple[list[Trace], int]:
    """Each rank's records up to its first collective that not every recorded member of its group reached, or
    that its members called differently (ranks stopped part-way, e.g. by Ctrl-C, reach different calls; ranks
    stopped on a mismatch diagnosis recorded both sides of the mismatched call, which the merge would refuse
    after the diagnosis was printed: issue 32, row 7). Returns the cut traces and how many records were left
    out."""
    recorded = {t.rank for t in traces}
    calls: dict[int, list[tuple[int, tuple[int, ...]]]] = {}       # rank -> (record index, group) per collective
    called: dict[tuple[int, ...], dict[int, list[tuple]]] = {}      # group -> rank -> (kind, bytes) of each call
    for t in traces:
        mine = calls.setdefault(t.rank, [])
        for i, r in enumerate(t.records):
            if isinstance(r, CollectiveRecord):
                group = tuple(r.group) or tuple(range(world))
                mine.append((i, group))
                called.setdefault(group, {}).setdefault(t.rank, []).append((r.kind, r.bytes))
    common = {group: _agreed_calls([by_rank.get(m, []) for m in group if m in recorded])
              for group, by_rank in called.items()}
    cut, dropped = [], 0
    for t in traces:
        seen: dict[tuple[int, ...], int] = {}
        end = len(t.records)
        for i, group in calls.get(t.rank, []):
            seen[group] = seen.get(group, 0) + 1
            if seen[group] > common[group]:
                end = i
                break
        dropped += len(t.records) - end
        cut.append(dataclasses.replace(t, records=t.records[:end]))
    return cut, dropped


def _crash_type(result: LaunchResult) -> str | None:
    """The exception a crashed rank's script raised ("ValueError: ..." in its status), or RankCrashed for a rank
    a signal ended (the OOM killer's SIGKILL): the run's cause. The others' CollectiveMismatchError only says
    they were stopped waiting for it (issue 32, row 7)."""
    for _, detail in sorted(result.crashed.items()):
        name = detail.split(":", 1)[0].strip()
        if name.isidentifier() and name[:1].isupper():
            return name
        if detail.startswith("killed by"):
            return "RankCrashed"
    return None                     # a rank that exited after its peers' diagnosis is no cause of its own


def _agreed_calls(sides: list[list[tuple]]) -> int:
    """How many calls, from the first, every member recorded alike."""
    count = min(len(side) for side in sides)
    return next((k for k in range(count) if len({side[k] for side in sides}) > 1), count)


def ranks_one_meta(trace: Trace) -> Trace:
    """Mark a --ranks one trace (the rule is in meta.ranks_one once a collective used it)."""
    return dataclasses.replace(trace, meta=trace.meta.replace(ranks="one"))
