"""TPU-readiness lint: what in a program will cost more on a TPU than its author expects.

Checks: float64/complex use, host syncs inside the step loop, matmul shapes that waste MXU tiles,
HBM near capacity, recompilations, a per-chip batch too small for compute to hide collectives, and
torch.compile's graph breaks, Dynamo recompilations and graphs that could not be lowered.

Each check reads the trace (and a priced Timeline) and returns warnings as plain dicts
``{code, message, source}``; adding a check = one function in ``CHECKS``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from tpusim.compute import matmul_padding
from tpusim.spec import ChipSpec
from tpusim.timeline import Timeline
from tpusim.trace import HostRecord, OpRecord, StepMarker, Trace

Warning_ = dict[str, str]
HBM_NEAR_CAPACITY = 0.9
MXU_WASTE_SHARE = 0.05   # shapes with at least 5% of the program's matmul FLOPs...
MXU_USEFUL_OK = 0.75     # ...that use under 75% of the MXU tiles they occupy


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
    """Matmul dimensions that are not multiples of the MXU tile leave part of the array idle. Shapes
    that carry a noticeable share of the program's matmul FLOPs are flagged, whether or not they are
    MXU-bound at this size: a bigger batch makes them so."""
    total = 0.0
    flops: Counter[tuple[str, tuple[int, int, int, int]]] = Counter()
    sources: dict[tuple[str, tuple[int, int, int, int]], str] = {}
    for op in trace.of_kind(OpRecord):
        if op.matmul is None or min(op.matmul) <= 0:
            continue
        total += op.flops
        if any(size % chip.mxu_size for size in op.matmul[2:]):
            flops[(op.op, op.matmul)] += op.flops
            sources.setdefault((op.op, op.matmul), op.source)
    warnings = []
    for (name, shape), share in flops.most_common():
        if share < MXU_WASTE_SHARE * total or len(warnings) == 10:
            break
        batch, m, k, n = shape
        padded = matmul_padding(shape, chip)
        useful = (k * n) / (padded[2] * padded[3])
        if useful >= MXU_USEFUL_OK:
            continue
        short = " and ".join(f"{dim}={size}" for dim, size in (("k", k), ("n", n)) if size % chip.mxu_size)
        warnings.append(_warning(
            "mxu-padding", f"{name} with (batch, m, k, n) = {shape} ({share / total:.0%} of matmul FLOPs): {short} "
                           f"not a multiple of the {chip.mxu_size}-wide MXU, so {1 - useful:.0%} of its MXU work "
                           f"is padding (a head dim of 64 wastes half)", sources[(name, shape)]))
    return warnings


def hbm_near_capacity(trace: Trace, chip: ChipSpec, timeline: Timeline | None) -> list[Warning_]:
    if timeline is None or timeline.peak_hbm_bytes < HBM_NEAR_CAPACITY * chip.hbm_bytes:
        return []
    return [_warning("hbm", f"HBM peak {timeline.peak_hbm_bytes / 2**30:.1f} GiB is "
                            f"{timeline.peak_hbm_bytes / chip.hbm_bytes:.0%} of the {chip.name}'s "
                            f"{chip.hbm_bytes / 2**30:.0f} GiB: little headroom for larger batches")]


def recompilations(trace: Trace, chip: ChipSpec, timeline: Timeline | None) -> list[Warning_]:
    """Shapes that change from step to step recompile the same code (the classic PyTorch/XLA pain)."""
    stats = timeline.meta.get("compile_cache") if timeline is not None else None
    if stats is None:
        return []
    found: dict[str, list] = {}
    for recompile in stats.recompiles:
        found.setdefault(recompile.source, []).append(recompile)
    return [_warning("recompile", f"{len(items)} recompilation(s) of {items[0].op}: shapes changed from "
                                  f"{items[0].old_shapes} to {items[0].new_shapes}; pad or bucket them to a few "
                                  f"fixed shapes", source)
            for source, items in sorted(found.items())]


def communication_bound(trace: Trace, chip: ChipSpec, timeline: Timeline | None) -> list[Warning_]:
    """Collectives that take longer than all the kernels of the program cannot hide behind them: the per-chip batch is
    below the compute-bound threshold (scaling book: C / W_ici, about peak FLOP/s / bidirectional link bytes/s
    tokens per chip for data parallelism on one axis)."""
    if timeline is None or not timeline.collectives:
        return []
    collective_s = timeline.collective_s
    compute_s = sum(timeline.time_by_bound.values()) / max(1, len(timeline.chips_simulated))
    if collective_s <= compute_s:
        return []
    threshold = chip.peak_bf16_flops_per_s / (2 * chip.ici_link_bytes_per_s)
    return [_warning("comm-bound", f"collectives take {collective_s * 1e3:.3g} ms against {compute_s * 1e3:.3g} ms "
                                   f"of compute: the per-chip batch is below the compute-bound threshold (on "
                                   f"{chip.name} about {threshold:.0f} tokens per chip for data parallelism over one "
                                   f"torus axis, less over several), so communication cannot hide behind compute")]


def torch_compile_issues(trace: Trace, chip: ChipSpec, timeline: Timeline | None) -> list[Warning_]:
    """torch.compile's own pains, from the backend's ``trace.meta["torch_compile"]``: a graph break splits a
    program in two (eager Python between, two launches, no fusion across); a Dynamo recompilation re-traces
    and re-compiles a function; a graph whose ops the JAX lowering lacks runs op by op."""
    facts = trace.meta.get("torch_compile") or {}
    warnings = [_warning("graph-break", f"torch.compile graph break: {b['reason']}; the code around it runs as "
                                        f"separate programs", b["source"]) for b in facts.get("graph_breaks", [])]
    warnings += [_warning("dynamo-recompile", f"torch.compile recompiled {r['function']}: {r['reason']}")
                 for r in facts.get("recompiles", [])]
    warnings += [_warning("eager-graph", f"torch.compile {g['graph']} ran op by op: no JAX lowering for "
                                         f"{', '.join(g['missing'])}") for g in facts.get("eager_graphs", [])]
    return warnings


CHECKS: tuple[Callable[[Trace, ChipSpec, Timeline | None], list[Warning_]], ...] = (
    float64_use, syncs_in_step_loop, mxu_tile_waste, hbm_near_capacity, recompilations, communication_bound,
    torch_compile_issues)


def lint(trace: Trace, chip: ChipSpec, timeline: Timeline | None = None) -> list[dict[str, Any]]:
    return [warning for check in CHECKS for warning in check(trace, chip, timeline)]
