"""TPU-readiness lint: what in a program will cost more on a TPU than its author expects.

Each check reads the trace (and a priced Timeline) and returns warnings as plain dicts
``{code, message, source}``; adding a check = one function in ``CHECKS``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from tpusim.compute import matmul_padding
from tpusim.engine import Timeline
from tpusim.spec import ChipSpec
from tpusim.trace import HostRecord, OpRecord, StepMarker, Trace

Warning_ = dict[str, str]
HBM_NEAR_CAPACITY = 0.9
MXU_WASTE_THRESHOLD = 0.75   # warn when under 75% of a matmul's MXU work is useful


def _warning(code: str, message: str, source: str = "") -> Warning_:
    return {"code": code, "message": message, "source": source}


def float64_use(trace: Trace, chip: ChipSpec, timeline: Timeline | None) -> list[Warning_]:
    """TPUs have no native float64/complex: such ops run on the host (or as f32) and are slow."""
    found = Counter((op.op, op.source) for op in trace.of_kind(OpRecord)
                    if op.dtype in ("float64", "complex64", "complex128"))
    ops = trace.meta.get("f64_ops") or []
    warnings = [_warning("float64", f"{op} uses float64/complex ({n}x): TPUs have no native f64; "
                                    f"it runs on the host. Use float32 or bfloat16", source)
                for (op, source), n in sorted(found.items())]
    if ops and not warnings:
        warnings.append(_warning("float64", f"ops ran on the host for float64/complex: {', '.join(sorted(ops))}"))
    return warnings


def syncs_in_step_loop(trace: Trace, chip: ChipSpec, timeline: Timeline | None) -> list[Warning_]:
    """A host sync (.item(), .cpu(), print of a value) inside the training loop stalls the host every
    step: the device queue drains and the host cannot run ahead."""
    seen_step = False
    found: Counter[tuple[str, str]] = Counter()
    for record in trace.records:
        if isinstance(record, StepMarker):
            seen_step = True
        elif seen_step and isinstance(record, HostRecord) and record.event in ("sync", "d2h"):
            found[(record.reason or record.event, record.source)] += 1
    return [_warning("host-sync", f"host sync `{reason}` inside the step loop ({n}x): the host waits for "
                                  f"the device each time; move it out of the loop or log less often", source)
            for (reason, source), n in sorted(found.items())]


def mxu_tile_waste(trace: Trace, chip: ChipSpec, timeline: Timeline | None) -> list[Warning_]:
    """Matmul dimensions that are not multiples of the MXU tile leave part of the array idle."""
    found: dict[tuple[str, tuple[int, int, int, int]], tuple[str, float]] = {}
    for op in trace.of_kind(OpRecord):
        if op.matmul is None or min(op.matmul) <= 0:
            continue
        batch, m, k, n = op.matmul
        padded = matmul_padding(op.matmul, chip)
        useful = (batch * m * k * n) / max(1, padded[0] * padded[1] * padded[2] * padded[3])
        if useful < MXU_WASTE_THRESHOLD:
            found.setdefault((op.op, op.matmul), (op.source, useful))
    return [_warning("mxu-padding", f"{name} with (batch, m, k, n) = {shape} uses {useful:.0%} of the "
                                    f"{chip.mxu_size}x{chip.mxu_size} MXU tiles; pad k and n to multiples of "
                                    f"{chip.mxu_size} (e.g. a head dim of 64 wastes half)", source)
            for (name, shape), (source, useful) in sorted(found.items())][:10]


def hbm_near_capacity(trace: Trace, chip: ChipSpec, timeline: Timeline | None) -> list[Warning_]:
    if timeline is None or timeline.peak_hbm_bytes < HBM_NEAR_CAPACITY * chip.hbm_bytes:
        return []
    return [_warning("hbm", f"HBM peak {timeline.peak_hbm_bytes / 2**30:.1f} GiB is "
                            f"{timeline.peak_hbm_bytes / chip.hbm_bytes:.0%} of the {chip.name}'s "
                            f"{chip.hbm_bytes / 2**30:.0f} GiB: little headroom for larger batches")]


CHECKS: tuple[Callable[[Trace, ChipSpec, Timeline | None], list[Warning_]], ...] = (
    float64_use, syncs_in_step_loop, mxu_tile_waste, hbm_near_capacity)


def lint(trace: Trace, chip: ChipSpec, timeline: Timeline | None = None) -> list[dict[str, Any]]:
    return [warning for check in CHECKS for warning in check(trace, chip, timeline)]
