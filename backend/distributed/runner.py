"""What ``tpusim run`` calls for distributed scripts: choose --ranks, set the env, record every rank.

``--ranks auto`` (the default) runs every rank as its own process (``all``) when the slice has
2..16 chips and the script uses torch.distributed; otherwise one process plays rank 0 (``one``).
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

from tpusim.errors import TpusimError
from tpusim.script import ScriptOutcome
from tpusim.trace import Trace, read_trace, renumber

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
    from tpusim.backend.distributed.env import torchrun_env

    os.environ.update(torchrun_env(0, world, chips_per_host, "one", 29500))
    import tpusim.backend.distributed  # noqa: F401  (registers the "tpusim" backend)


def record_all(script: Path, argv: list[str], world: int, chips_per_host: int,
               out_dir: Path) -> tuple[Trace, ScriptOutcome]:
    """--ranks all: one process per rank; their traces merged into one multi-rank trace."""
    from tpusim.backend.distributed.launcher import launch

    ranks_dir = out_dir / "ranks"
    result = launch(script, argv, world, chips_per_host, ranks_dir, env={"TPUSIM_NUMERICS": os.environ.get(
        "TPUSIM_NUMERICS", "on"), "TPUSIM_CHIP": os.environ.get("TPUSIM_CHIP", "v5p")})
    traces = [read_trace(p) for p in result.traces if p.is_file()]
    records = [r for t in traces for r in t.records]
    meta = dict(traces[0].meta) if traces else {}
    meta["ranks"] = "all"
    meta["ranks_recorded"] = [t.rank for t in traces]
    trace = Trace(records=renumber(records), world_size=world, rank=0, meta=meta)
    if result.ok:
        return trace, ScriptOutcome(exit_code=0)
    summary = result.summary()
    kind = "CollectiveMismatchError" if result.diagnosis else "RankCrashed"
    code = max((c for c in result.exit_codes if c > 0), default=1)
    return trace, ScriptOutcome(exit_code=code, error=summary + "\n", error_type=kind)


def ranks_one_meta(trace: Trace) -> Trace:
    """Mark a --ranks one trace (the rule is in meta["ranks_one"] once a collective used it)."""
    return dataclasses.replace(trace, meta={**trace.meta, "ranks": "one"})
