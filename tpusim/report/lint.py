"""TPU-readiness lint: what in a program will cost more on a TPU than its author expects.

Each rule reads the trace (and a priced Timeline) and finds ``(message, source)`` pairs; ``lint``
turns them into ``LintWarning(code, message, source)`` values, in the order of ``RULES``, the one
table of lint codes (report.json's ``warnings[].code``). Adding a lint rule = one function and
one row in ``RULES``.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tpusim.eager.compile_cache import Recompile
from tpusim.hardware.compute import matmul_padding
from tpusim.hardware.spec import ChipSpec
from tpusim.pricing.timeline import Timeline
from tpusim.report import fused_lint, torchtpu
from tpusim.trace.records import (
    OFFLOAD_REASON,
    CollectiveRecord,
    DynamoRecompile,
    HostRecord,
    OpRecord,
    StepMarker,
    Trace,
)

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


def step_of_records(trace: Trace) -> list[int | None]:
    """Each record's step in its own rank's program (records before the rank's k-th StepMarker are step k);
    None after the rank's last marker (eval, torch.save, printing results: code after the training loop)."""
    last_marker: dict[int, int] = {}
    for i, record in enumerate(trace.records):
        if isinstance(record, StepMarker):
            last_marker[record.rank] = i
    steps: list[int | None] = []
    step: Counter[int] = Counter()
    for i, record in enumerate(trace.records):
        rank = record.rank
        steps.append(step[rank] if i < last_marker.get(rank, -1) else None)
        if isinstance(record, StepMarker):
            step[rank] += 1
    return steps


def syncs_in_step_loop(trace: Trace, chip: ChipSpec, timeline: Timeline | None) -> list[Finding]:
    """A host sync (.item(), .cpu(), print of a value) inside the training loop stalls the host every
    step: the device queue drains and the host cannot run ahead. Inside the loop means: the same sync (reason
    and line) recurs in two or more steps. A sync that runs once before the loop (a DDP constructor's
    broadcast) or after the last step (an eval pass, torch.save) is not flagged."""
    steps_of: dict[tuple[str, str], set[int]] = {}
    count: Counter[tuple[str, str]] = Counter()
    first_rank = min((r.rank for r in trace.records), default=0)    # --ranks all: every rank ran the loop
    for record, step in zip(trace.records, step_of_records(trace)):
        if (step is not None and record.rank == first_rank and isinstance(record, HostRecord)
                and record.event in ("sync", "d2h") and record.reason != OFFLOAD_REASON):   # offloads: own row
            key = (record.reason or record.event, record.source)
            steps_of.setdefault(key, set()).add(step)
            count[key] += 1
    return [(f"host sync `{reason}` inside the step loop ({count[(reason, source)]}x in {len(steps)} steps): the "
             f"host waits for the device each time; move it out of the loop or log less often", source)
            for (reason, source), steps in sorted(steps_of.items()) if len(steps) >= 2]


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
                         f"is padding{_padding_hint(name, k, n, chip)}", sources[(name, shape)]))
    return findings


def _padding_hint(op: str, k: int, n: int, chip: ChipSpec) -> str:
    """The attention head-dim hint, only where it applies: an attention-family op, or a bmm with a dimension
    of half the MXU (what a head dim of 64 gives on a 128-wide MXU)."""
    half = chip.mxu_size // 2
    if "attention" in op or ("bmm" in op and half in (k, n)):
        return f" (a head dim of {half} wastes half of a {chip.mxu_size}-wide MXU)"
    return ""


def hbm_near_capacity(trace: Trace, chip: ChipSpec, timeline: Timeline | None) -> list[Finding]:
    if timeline is None or timeline.peak_hbm_bytes < HBM_NEAR_CAPACITY * chip.hbm_bytes:
        return []
    full = timeline.peak_hbm_bytes >= chip.hbm_bytes      # the allocation past it failed: the script's OOM
    advice = ("full: smaller batches, activation checkpointing or more sharding would fit" if full
              else "little headroom for larger batches")
    return [(f"HBM peak {timeline.peak_hbm_bytes / 2**30:.1f} GiB is {timeline.peak_hbm_bytes / chip.hbm_bytes:.0%} "
             f"of the {chip.name}'s {chip.hbm_bytes / 2**30:.0f} GiB: {advice}", "")]


def step_loop_recompiles(trace: Trace, recompiles: Sequence[Recompile]) -> list[Recompile]:
    """The recompiles that count, by one rule for the lint, report.json, the summary and ``tpusim check``: only
    inside the step loop (an eval pass after it compiles its own shapes once, as it should) and only where the
    same op at that line changed a size (the same tensor ranks): a pairing of two unrelated ops that share a
    position, ``aten::copy_ (144,) -> (256,16,48)``, is no recompile of one op."""
    step_of = {r.seq: step for r, step in zip(trace.records, step_of_records(trace)) if hasattr(r, "seq")}
    return [r for r in recompiles
            if step_of.get(r.seq) is not None and _same_ranks(r.old_shapes, r.new_shapes)]


def recompilations(trace: Trace, chip: ChipSpec, timeline: Timeline | None) -> list[Finding]:
    """Shapes that change from step to step recompile the same code (the classic PyTorch/XLA pain); which
    recompiles count: ``step_loop_recompiles``. One cause is named: a short last batch (only the loop's last
    step recompiles, its leading dim shrunk), which TorchTPU compiles anew for one step."""
    stats = timeline.meta.get("compile_cache") if timeline is not None else None
    if stats is None:
        return []
    step_of = {r.seq: step for r, step in zip(trace.records, step_of_records(trace)) if hasattr(r, "seq")}
    last = max((step for step in step_of.values() if step is not None), default=None)
    found: dict[str, list] = {}
    for recompile in step_loop_recompiles(trace, stats.recompiles):
        found.setdefault(recompile.source, []).append(recompile)
    findings = []
    for source, items in sorted(found.items()):
        old, new = items[0].old_shapes, items[0].new_shapes
        if {step_of.get(r.seq) for r in items} == {last} and _shorter_batch(old, new):
            findings.append((f"{len(items)} recompilation(s) of {items[0].op} in the last step only: a short last "
                             f"batch ({old[0][0]} -> {new[0][0]} rows) is compiled anew on TorchTPU for one step; drop "
                             f"it (DataLoader(drop_last=True)) or pad it to the full batch", source))
        else:
            findings.append((f"{len(items)} recompilation(s) of {items[0].op}: shapes changed from {old} to {new}; pad "
                             f"or bucket them to a few fixed shapes", source))
    return findings


def _shorter_batch(old: tuple, new: tuple) -> bool:
    """The first tensor's leading (batch) dim shrank and nothing else of its shape changed."""
    return bool(old and new and old[0] and new[0]) and new[0][0] < old[0][0] and new[0][1:] == old[0][1:]


def _same_ranks(old: tuple, new: tuple) -> bool:
    """Two shape lists of the same tensors: as many tensors, each of the same rank."""
    return len(old) == len(new) and all(len(a) == len(b) for a, b in zip(old, new))


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


_SCALAR_GUARD = re.compile(r"==\s*-?\d")              # a guard on a Python number's value: "L['lr'] == 0.01"
_SIZE_GUARD = re.compile(r"size mismatch at index (\d+)")  # "tensor 'x' size mismatch at index 0. expected 8, actual 5"
_USER_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def dynamo_recompiles(trace: Trace, chip: ChipSpec, timeline: Timeline | None) -> list[Finding]:
    """A Dynamo recompilation re-traces and re-compiles a function; on TorchTPU each is a new XLA compile. The
    guard that failed names the cause: a Python number guarded by its value (a float or int that changes
    between calls, a learning rate from a scheduler), or a tensor size (a short last batch)."""
    facts = trace.meta.torch_compile
    return [(f"torch.compile recompiled {r.function}: {_recompile_cause(r)}", _dynamo_source(r))
            for r in (facts.recompiles if facts else ())]


def _recompile_cause(recompile: DynamoRecompile) -> str:
    guard = recompile.reason.strip().splitlines()[0].split("#", 1)[0].strip() if recompile.reason.strip() else ""
    size = _SIZE_GUARD.search(guard)
    if size:
        batch = " (at index 0, the batch: a short last batch? drop it or pad it)" if size.group(1) == "0" else ""
        return f"{guard}: a tensor's size changed{batch}; pad or bucket sizes to a few fixed shapes"
    if _SCALAR_GUARD.search(guard) and "len(" not in guard and "stride" not in guard:
        return (f"{guard}: a Python number that changes between calls is a constant of the compiled graph, so each "
                f"new value compiles anew; pass it as a tensor (torch.tensor(value, device=...))")
    return guard or recompile.reason


def _dynamo_source(recompile: DynamoRecompile) -> str:
    """The user's line: the failing guard's frame when Dynamo names one, else the recompiled function's."""
    frames = _USER_FRAME.findall(recompile.reason)
    if frames:
        path, line = frames[-1]
        return f"{os.path.basename(path)}:{line}"
    where = re.search(r"\(([^()]+):(\d+)\)$", recompile.function)
    return f"{os.path.basename(where.group(1))}:{where.group(2)}" if where else ""


def eager_graphs(trace: Trace, chip: ChipSpec, timeline: Timeline | None) -> list[Finding]:
    """A compiled graph whose ops the JAX lowering lacks runs op by op."""
    facts = trace.meta.torch_compile
    return [(f"torch.compile {g.graph} ran op by op: no JAX lowering for {', '.join(g.missing)}", "")
            for g in (facts.eager_graphs if facts else ())]


def torchtpu_unlowered_ops(trace: Trace, chip: ChipSpec, timeline: Timeline | None) -> list[Finding]:
    """ATen ops TorchTPU has no lowering for (tpusim/report/torchtpu.py's table, counted from its source): tpusim
    ran them with CPU's kernels, TorchTPU raises NotImplementedError (or runs them on the host with its fallback
    on). Once per op, at the first line that called it. Only eager ops are judged: an op inside a torch.compile'd
    graph (``program > 0``) goes to the compiler with its graph, never to TorchTPU's eager lowering table."""
    calls: Counter[str] = Counter()
    first: dict[str, str] = {}
    for op in trace.of_kind(OpRecord):
        if op.program == 0 and not torchtpu.lowers(op.op):
            calls[op.op] += 1
            first.setdefault(op.op, op.source)
    return [(f"{name} ({n}x) has no TorchTPU lowering: on TorchTPU this op fails (NotImplementedError), or falls "
             f"back to the host under fallback_mode(FallbackMode.ALLOW_FALLBACK); tpusim ran it with CPU's kernel",
             first[name])
            for name, n in sorted(calls.items())]


def attention_off_flash(trace: Trace, chip: ChipSpec, timeline: Timeline | None) -> list[Finding]:
    """Attention calls whose shapes or dtype miss TorchTPU's fused flash-attention kernel (its chooser's conditions
    as data: tpusim/report/data/torchtpu_attention.toml). An eager call takes the path that chooser takes
    (tpusim/backend/csrc/attention.cpp), so the finding names it and says tpusim priced it there; a compiled
    graph's attention tpusim prices as a flash kernel whatever its shapes, so there the finding says tpusim departs
    from TorchTPU. Once per line."""
    conditions = torchtpu.flash_conditions()
    found: dict[str, tuple[tuple[int, ...], str, list[str], bool]] = {}
    for op in trace.of_kind(OpRecord):
        if op.op in torchtpu.ATTENTION_FORWARD_OPS and len(op.inputs) >= 3 and op.source not in found:
            q, k, v = op.inputs[:3]
            reasons = conditions.misses(q.shape, k.shape, v.shape, q.dtype)
            if reasons:
                compiled = op.program > 0 or op.op == "tpusim::attention"
                found[op.source] = (q.shape, q.dtype, reasons, compiled)
    return [(f"scaled_dot_product_attention with query {shape} {dtype} misses TorchTPU's fused flash-attention "
             f"kernel: {'; '.join(reasons)}; "
             + ("tpusim prices this compiled attention as a flash kernel, which TorchTPU would not take: the step "
                "may be optimistic" if compiled else
                "TorchTPU runs it on its StableHLO path (the whole score matrix through HBM, in float32 when "
                "training), and tpusim prices it there"), source)
            for source, (shape, dtype, reasons, compiled) in sorted(found.items())]


def compile_under_inference_mode(trace: Trace, chip: ChipSpec, timeline: Timeline | None) -> list[Finding]:
    """torch.compile run under torch.inference_mode(): tpusim compiles it, TorchTPU's torch.compile cannot capture
    the graph (its error glossary, docs/notebooks/error_glossary.py, "The inference_mode Crash")."""
    return [("torch.compile ran under torch.inference_mode(): on TorchTPU this fails (torch.compile cannot capture "
             "graphs under inference_mode); use torch.no_grad() instead", source)
            for source in trace.meta.inference_mode_compiles or ()]


def uses_one_chip(trace: Trace) -> bool:
    """A program that ran no collective, built no device mesh and ran as one process (no process group in use)
    runs on one chip, whatever the slice: the slice's other chips idle."""
    if trace.meta.meshes or len(trace.meta.ranks_recorded or ()) > 1:
        return False
    return not any(isinstance(r, CollectiveRecord) for r in trace.records)


def idle_chips(trace: Trace, chip: ChipSpec, timeline: Timeline | None) -> list[Finding]:
    """A one-chip program priced on a slice of many (``trace.world_size``: the slice's chips): the figures are
    one chip's, and a bigger slice makes it no faster."""
    if trace.world_size <= 1 or not uses_one_chip(trace):
        return []
    idle = trace.world_size - 1
    return [(f"the program runs no collective, so it uses 1 of the slice's {trace.world_size} chips: the other "
             f"{idle} idle and every figure is one chip's; a process group (DDP, FSDP2, DTensor) would use them", "")]


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
    "torchtpu-op": (torchtpu_unlowered_ops, "ATen ops TorchTPU does not lower: they fail on TorchTPU (or run on the "
                    "host)"),
    "attention-path": (attention_off_flash, "attention shapes or dtypes that miss TorchTPU's fused flash kernel"),
    "compile-inference-mode": (compile_under_inference_mode, "torch.compile under torch.inference_mode(), which "
                               "fails on TorchTPU"),
    "fused-rank-cuts": (fused_lint.rank_cluster_cuts, "Fused eager clusters that end at other ops on another rank "
                        "(a hang on TorchTPU)"),
    "fused-decode": (fused_lint.decode_recompiles, "a decode loop under Fused eager: every step compiles anew"),
    "idle-chips": (idle_chips, "a one-chip program on a slice of many: the other chips idle"),
}


def lint(trace: Trace, chip: ChipSpec, timeline: Timeline | None = None) -> list[LintWarning]:
    """Every rule's findings, in ``RULES`` order."""
    return [LintWarning(code, message, source)
            for code, (rule, _) in RULES.items() for message, source in rule(trace, chip, timeline)]
