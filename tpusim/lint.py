"""TPU-readiness lint: what in a program will cost more on a TPU than its author expects.

Each rule reads the trace (and a priced Timeline) and finds ``(message, source)`` pairs; ``lint``
turns them into ``LintWarning(code, message, source)`` values, in the order of ``RULES``, the one
table of lint codes (report.json's ``warnings[].code``). Adding a lint rule = one function and
one row in ``RULES``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from tpusim.compute import matmul_padding
from tpusim.spec import ChipSpec
from tpusim.timeline import Timeline
from tpusim.trace import HostRecord, OpRecord, StepMarker, Trace

HBM_NEAR_CAPACITY = 0.9
MXU_WASTE_SHARE = 0.05   # shapes with at least 5% of the program's matmul FLOPs...
MXU_USEFUL_OK = 0.75     # ...that use under 75% of the MXU tiles they occupy


@dataclass(frozen=True)
class LintWarning:
    """One finding: its rule's code, what to do about it, and the user's line ("" when it has none)."""

    code: str
    message: str
    source: str = ""


Finding = tuple[str, str]   # (message, source)


def float64_use(trace: Trace, chip: ChipSpec, timeline: Timeline | None) -> list[Finding]:
    """TPUs have no native float64/complex: such ops run on the host (or as f32) and are slow."""
    found = Counter((op.op, op.source) for op in trace.of_kind(OpRecord)
                    if op.dtype in ("float64", "complex64", "complex128"))
    ops = trace.meta.f64_ops or ()
    findings = [(f"{op} uses float64/complex ({n}x): TPUs have no native f64; it runs on the host. "
                 f"Use float32 or bfloat16", source) for (op, source), n in sorted(found.items())]
    if ops and not findings:
        findings.append((f"ops ran on the host for float64/complex: {', '.join(sorted(ops))}", ""))
    return findings


def syncs_in_step_loop(trace: Trace, chip: ChipSpec, timeline: Timeline | None) -> list[Finding]:
    """A host sync (.item(), .cpu(), print of a value) inside the training loop stalls the host every
    step: the device queue drains and the host cannot run ahead."""
    seen_step = False
    found: Counter[tuple[str, str]] = Counter()
    for record in trace.records:
        if isinstance(record, StepMarker):
            seen_step = True
        elif seen_step and isinstance(record, HostRecord) and record.event in ("sync", "d2h"):
            found[(record.reason or record.event, record.source)] += 1
    return [(f"host sync `{reason}` inside the step loop ({n}x): the host waits for the device each time; "
             f"move it out of the loop or log less often", source) for (reason, source), n in sorted(found.items())]


def mxu_tile_waste(trace: Trace, chip: ChipSpec, timeline: Timeline | None) -> list[Finding]:
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
    findings: list[Finding] = []
    for (name, shape), share in flops.most_common():
        if share < MXU_WASTE_SHARE * total or len(findings) == 10:
            break
        batch, m, k, n = shape
        padded = matmul_padding(shape, chip)
        useful = (k * n) / (padded[2] * padded[3])
        if useful >= MXU_USEFUL_OK:
            continue
        short = " and ".join(f"{dim}={size}" for dim, size in (("k", k), ("n", n)) if size % chip.mxu_size)
        findings.append((f"{name} with (batch, m, k, n) = {shape} ({share / total:.0%} of matmul FLOPs): {short} "
                         f"not a multiple of the {chip.mxu_size}-wide MXU, so {1 - useful:.0%} of its MXU work "
                         f"is padding (a head dim of 64 wastes half)", sources[(name, shape)]))
    return findings


def hbm_near_capacity(trace: Trace, chip: ChipSpec, timeline: Timeline | None) -> list[Finding]:
    if timeline is None or timeline.peak_hbm_bytes < HBM_NEAR_CAPACITY * chip.hbm_bytes:
        return []
    return [(f"HBM peak {timeline.peak_hbm_bytes / 2**30:.1f} GiB is {timeline.peak_hbm_bytes / chip.hbm_bytes:.0%} "
             f"of the {chip.name}'s {chip.hbm_bytes / 2**30:.0f} GiB: little headroom for larger batches", "")]


def recompilations(trace: Trace, chip: ChipSpec, timeline: Timeline | None) -> list[Finding]:
    """Shapes that change from step to step recompile the same code (the classic PyTorch/XLA pain)."""
    stats = timeline.meta.get("compile_cache") if timeline is not None else None
    if stats is None:
        return []
    found: dict[str, list] = {}
    for recompile in stats.recompiles:
        found.setdefault(recompile.source, []).append(recompile)
    return [(f"{len(items)} recompilation(s) of {items[0].op}: shapes changed from {items[0].old_shapes} to "
             f"{items[0].new_shapes}; pad or bucket them to a few fixed shapes", source)
            for source, items in sorted(found.items())]


def communication_bound(trace: Trace, chip: ChipSpec, timeline: Timeline | None) -> list[Finding]:
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
    return [(f"collectives take {collective_s * 1e3:.3g} ms against {compute_s * 1e3:.3g} ms of compute: the "
             f"per-chip batch is below the compute-bound threshold (on {chip.name} about {threshold:.0f} tokens per "
             f"chip for data parallelism over one torus axis, less over several), so communication cannot hide "
             f"behind compute", "")]


def graph_breaks(trace: Trace, chip: ChipSpec, timeline: Timeline | None) -> list[Finding]:
    """A torch.compile graph break (``trace.meta.torch_compile``) splits a program in two: eager Python between,
    two launches, no fusion across."""
    facts = trace.meta.torch_compile
    return [(f"torch.compile graph break: {b.reason}; the code around it runs as separate programs", b.source)
            for b in (facts.graph_breaks if facts else ())]


def dynamo_recompiles(trace: Trace, chip: ChipSpec, timeline: Timeline | None) -> list[Finding]:
    """A Dynamo recompilation re-traces and re-compiles a function."""
    facts = trace.meta.torch_compile
    return [(f"torch.compile recompiled {r.function}: {r.reason}", "") for r in (facts.recompiles if facts else ())]


def eager_graphs(trace: Trace, chip: ChipSpec, timeline: Timeline | None) -> list[Finding]:
    """A compiled graph whose ops the JAX lowering lacks runs op by op."""
    facts = trace.meta.torch_compile
    return [(f"torch.compile {g.graph} ran op by op: no JAX lowering for {', '.join(g.missing)}", "")
            for g in (facts.eager_graphs if facts else ())]


Rule = Callable[[Trace, ChipSpec, Timeline | None], list[Finding]]

# The lint codes, in the order their warnings are listed: code -> (rule, what it flags).
RULES: dict[str, tuple[Rule, str]] = {
    "float64": (float64_use, "float64/complex ops, which a TPU runs on the host"),
    "host-sync": (syncs_in_step_loop, "host syncs (.item(), .cpu(), print) inside the step loop"),
    "mxu-padding": (mxu_tile_waste, "matmul shapes that leave MXU tiles half empty"),
    "hbm": (hbm_near_capacity, "HBM peak near the chip's capacity"),
    "recompile": (recompilations, "the same code compiled again for new shapes"),
    "comm-bound": (communication_bound, "collectives that compute cannot hide (per-chip batch too small)"),
    "graph-break": (graph_breaks, "torch.compile graph breaks"),
    "dynamo-recompile": (dynamo_recompiles, "Dynamo recompilations"),
    "eager-graph": (eager_graphs, "compiled graphs that ran op by op (no JAX lowering)"),
}


def lint(trace: Trace, chip: ChipSpec, timeline: Timeline | None = None) -> list[LintWarning]:
    """Every rule's findings, in ``RULES`` order."""
    return [LintWarning(code, message, source)
            for code, (rule, _) in RULES.items() for message, source in rule(trace, chip, timeline)]
