"""Inference programs: prefill and decode told apart, and what a serving engineer reads (report.json ``inference``).

Why a module of its own: the report speaks of training steps; a decode loop marks none, and its numbers are others:
time to first token (TTFT: the prefill's time), time per output token (TPOT: median and p90 over the decode steps),
tokens/s, and how far a token step is from the HBM roofline of reading the weights and the KV cache once.

**Phases.** Marked ones first (``tpusim.backend.phase``: dispatch records with reason ``phase:<name>``; the batch is
the first decode step's attention query's, else, attention written as matmuls, the KV cache's first dim). Else
detected from the attention calls (the attention family of tpusim/trace/ops.py; the first input is the query,
[batch, heads, length, head_dim]): a program with no backward whose attention runs with query length 1 is decoding;
the run of calls with query length > 1 just before the first such call is the prefill, and its call count the
layers, so each ``layers`` calls of query length 1 are one decode step (a static KV cache: the same K/V storages
every step; a growing one: new ones). A decode loop without an attention op (attention written as matmuls, as
transformers' SDPA reaches "tpu" today) is found by the growing shapes fused_lint's ``decode_recompiles`` finds
(``growing_op``: a ``cat`` growing by one each step: generate()'s tokens, or a dynamic KV cache).
The prefill starts at its first op that reads a weight (the embedding); a detected step as many ops before its first
attention call as the prefill ran before its own (the embedding, projections, cache writes); the last step is as
long, in records, as the one before, when it runs as many ops.

**KV cache.** The tensors the attention reads as K and V (inputs 1 and 2) whose storage persists across decode steps
(else the 4-D buffers every step writes and none allocates, as a static cache behind ``repeat_kv`` copies or
matmul attention; else the 4-D ``cat`` outputs one token longer each step, as they stand in the last step); its
bytes are the storages' (their alloc records), per token and sequence ``nbytes / (batch x length)`` of each.
**Weights**: the storages read in two decode steps or more and written or allocated by none, less the cache. Both
are per chip, as the trace of one rank holds them.

**Per mode** (each eager mode prices the same phases): a phase's time runs from the end of the device work before it
to the end of its own (op, collective and wait events whose record falls in it); the bound, MXU and HBM utilisation
of each phase are the headline's (tpusim/report/headline.py) over its window (decode's: the steps after the first,
which compiles what the loop runs and is warm-up). Tensor-parallel decode: the collectives of those steps, exposed
per step (not hidden under compute), their share of TPOT, and how much of their time is latency (the closed form's
alpha: start-up + hops x hop latency) rather than bytes / bandwidth. Tokens/s: batch x decode steps /
decode time for the recorded rank; per slice x chips when no collective ran (every chip a replica), else the same
tokens shared by the slice's chips.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import median, quantiles
from typing import Any

from tpusim.hardware.spec import ChipSpec
from tpusim.pricing.plan import rank_records
from tpusim.pricing.timeline import Timeline
from tpusim.pricing.tokens import token_steps
from tpusim.report.fused_lint import growing_op, grown_dim, has_backward
from tpusim.report.headline import headline
from tpusim.report.steps import Steps
from tpusim.report.text import seconds_text
from tpusim.trace.ops import Family, base_name
from tpusim.trace.phases import Span, marked_spans, span_index
from tpusim.trace.records import (
    CollectiveRecord,
    MemoryRecord,
    OpRecord,
    Record,
    StepMarker,
    Trace,
)
from tpusim.units import format_bytes

MIN_DETECTED_STEPS = 3      # a decode loop found without markers: at least this many steps
LAST_STEP_OPS = 0.9         # the records after the last step start are a step when they run this share of its ops



@dataclass(frozen=True)
class Phases:
    """Where a program's prefill and decode steps are (record seq ranges), and how that was found."""

    found_by: str                       # "marked" (tpusim.backend.phase) or "detected" (attention shapes)
    prefill: Span | None
    decode: tuple[Span, ...]
    batch: int
    prompt_tokens: int | None


def find_phases(trace: Trace) -> Phases | None:
    """The program's phases (module docstring), or None when it has no decode step."""
    records = next(iter(rank_records(trace).values()), ())
    if not records:
        return None
    return _marked(records) or _detected(records)


def _marked(records: Sequence[Record]) -> Phases | None:
    prefill, decode = marked_spans(records)
    if not decode:
        return None
    batch, prompt = _attention_shape(records, decode[0]), _attention_shape(records, prefill, length=True)
    return Phases("marked", prefill, decode, batch or 0, prompt)     # 0: no attention op; the KV cache says


def _attention_shape(records: Sequence[Record], span: Span | None, length: bool = False) -> int | None:
    """The batch (or query length) of the first attention call in ``span``."""
    if span is None:
        return None
    for rec in records:
        if span[0] <= rec.seq < span[1] and _is_attention(rec):
            query = rec.inputs[0].shape
            return query[-2] if length else query[0]
    return None


def _is_attention(rec: Record) -> bool:
    return (isinstance(rec, OpRecord) and rec.family == Family.ATTENTION and "backward" not in rec.op
            and len(rec.inputs) >= 3 and len(rec.inputs[0].shape) >= 3)


def _detected(records: Sequence[Record]) -> Phases | None:
    if has_backward(records):
        return None
    calls = [r for r in records if _is_attention(r)]
    first_decode = next((i for i, r in enumerate(calls) if r.inputs[0].shape[-2] == 1), None)
    end = records[-1].seq + 1
    if first_decode is None:
        return _detected_by_growth(records, end)
    layers = 0
    while layers < first_decode and calls[first_decode - 1 - layers].inputs[0].shape[-2] > 1:
        layers += 1
    decode_calls = [r for r in calls[first_decode:] if r.inputs[0].shape[-2] == 1]
    if not layers and (grown := _detected_by_growth(records, end)) is not None:    # no prefill attention to count
        return grown                                  # layers by: generate()'s tokens growing by one say the steps
    per_step = layers or _layers_by_storage(decode_calls)
    starts = [c.seq for c in decode_calls[::per_step]]
    if len(starts) < MIN_DETECTED_STEPS:
        return None
    prefill, prompt = None, None
    if layers:
        first = calls[first_decode - layers]
        begin = _prefill_start(records, first.seq, _read_only(records, _spans(records, starts, end)))
        starts = _shifted(records, starts, _ops_between(records, begin, first.seq))
        prefill, prompt = (begin, starts[0]), first.inputs[0].shape[-2]
    return Phases("detected", prefill, _spans(records, starts, end), decode_calls[0].inputs[0].shape[0], prompt)


def _ops_between(records: Sequence[Record], start: int, end: int) -> int:
    return sum(1 for r in records if isinstance(r, OpRecord) and start <= r.seq < end)


def _shifted(records: Sequence[Record], starts: Sequence[int], head: int) -> list[int]:
    """Each step's start moved back over the ops a forward pass runs before its first attention call (the
    embedding, the projections, the cache write: as many as the prefill ran), so a step is one whole forward."""
    ops = [r.seq for r in records if isinstance(r, OpRecord)]
    where = {seq: i for i, seq in enumerate(ops)}
    shifted: list[int] = []
    for start in starts:
        moved = ops[max(0, where[start] - head)]
        shifted.append(max(moved, shifted[-1] + 1) if shifted else moved)
    return shifted


def _layers_by_storage(calls: Sequence[OpRecord]) -> int:
    """Attention calls per decode step when no prefill says it: until a K storage comes round again (static cache)."""
    seen: set[int] = set()
    for i, call in enumerate(calls):
        if call.inputs[1].storage in seen:
            return i
        seen.add(call.inputs[1].storage)
    return 1


def _detected_by_growth(records: Sequence[Record], end: int) -> Phases | None:
    growing = growing_op(records)
    if growing is None:
        return None
    starts, op, dim = growing
    batch = op.inputs[0].shape[0] if op.inputs[0].shape and dim != 0 else 1
    spans = _spans(records, starts, end)
    prefill = (_prefill_start(records, starts[0], _read_only(records, spans)), starts[0])
    return Phases("detected", prefill if prefill[0] < prefill[1] else None, spans, batch, None)


def _spans(records: Sequence[Record], starts: Sequence[int], end: int) -> tuple[Span, ...]:
    """Steps from their starts; the last as long as the one before (the records after it are no step of the loop),
    and a step only when it runs most of the ops the one before ran (after a loop whose steps end with the grown
    op, as generate()'s token ``cat``, what follows the last start is the loop's exit, no step)."""
    if not starts:
        return ()
    period = starts[-1] - starts[-2] if len(starts) > 1 else end - starts[-1]
    bounds = [*starts, min(end, starts[-1] + period)]
    spans = tuple(zip(bounds, bounds[1:]))
    if len(spans) > 1 and _ops_between(records, *spans[-1]) < LAST_STEP_OPS * _ops_between(records, *spans[-2]):
        spans = spans[:-1]
    return spans


def _prefill_start(records: Sequence[Record], before: int, weights: set[int]) -> int:
    """The prompt's forward pass begins at its first op that reads a weight (the embedding): going back from
    ``before``, the earliest op reading one before an op that writes one (the weights' init or copy in) or a step."""
    start = None
    for rec in reversed(records):
        if rec.seq >= before:
            continue
        if isinstance(rec, StepMarker):
            break
        if isinstance(rec, OpRecord):
            if any(t.storage in weights for t in (*rec.outputs, *(rec.inputs[:1] if _in_place(rec) else ()))):
                break
            if any(t.storage in weights for t in rec.inputs):
                start = rec.seq
    return start if start is not None else before


def _in_place(rec: OpRecord) -> bool:
    return rec.op.endswith("_") or rec.op.endswith("_out")


def _read_only(records: Sequence[Record], spans: Sequence[Span]) -> set[int]:
    """Storages two decode steps or more read and none writes or allocates: the weights (and a static KV cache's
    storages, which the attention reads but ``index_copy_`` writes, are not among them)."""
    step_of = span_index(spans)
    read_in: dict[int, set[int]] = {}
    excluded: set[int] = set()
    for rec in records:
        step = step_of(rec.seq)
        if step is None:
            continue
        if isinstance(rec, MemoryRecord) and rec.event == "alloc":
            excluded.add(rec.storage)
        elif isinstance(rec, OpRecord):
            for t in rec.inputs:
                read_in.setdefault(t.storage, set()).add(step)
            excluded.update(t.storage for t in (*rec.outputs, *(rec.inputs[:1] if _in_place(rec) else ())))
    return {s for s, steps in read_in.items() if len(steps) > 1 and s not in excluded}


# ---- KV cache and weights ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Footprint:
    """What a decode step reads from HBM that outlives it: the weights and the KV cache (bytes per chip)."""

    weights_bytes: int
    kv_bytes: int
    kv_bytes_per_token: float            # per sequence and token of context
    kv_context: int                      # tokens of context the cache holds
    kv_dtype: str
    kv_tensors: int
    kv_persistent: bool                  # a static cache (the same storages every step)
    kv_batch: int = 0                    # sequences the cache holds ([batch, heads, context, head_dim]; 0: unknown)


def footprint(records: Sequence[Record], phases: Phases) -> Footprint:
    """The weights and KV cache of the decode steps (module docstring)."""
    sizes: dict[int, int] = {}
    metas: dict[int, Any] = {}
    step_of = span_index(phases.decode)
    for rec in records:
        if isinstance(rec, MemoryRecord) and rec.event == "alloc":
            sizes[rec.storage] = rec.bytes
    kv_steps: dict[int, set[int]] = {}
    last_kv: dict[int, Any] = {}
    last_step = len(phases.decode) - 1
    for rec in records:
        step = step_of(rec.seq)
        if step is None or not isinstance(rec, OpRecord):
            continue
        for t in rec.inputs:
            metas.setdefault(t.storage, t)
        if _is_attention(rec):
            for t in rec.inputs[1:3]:
                kv_steps.setdefault(t.storage, set()).add(step)
                metas[t.storage] = t
                if step == last_step:
                    last_kv[t.storage] = t
    persistent = {s for s, steps in kv_steps.items() if len(steps) > 1}
    if not persistent:          # attention reads copies (repeat_kv) or is written as matmuls: the buffers every
        persistent = _updated_in_place(records, phases.decode, step_of, metas)   # step writes in place
    if not persistent and not kv_steps:                         # or the K/V a cat grows by one token a step
        for t in _grown_caches(records, phases.decode, step_of):
            last_kv[t.storage], metas[t.storage] = t, t
    kv = persistent or set(last_kv)
    kv_metas = [metas[s] for s in sorted(kv)]
    kv_bytes = sum(max(sizes.get(s, 0), metas[s].nbytes) for s in kv)
    per_token = sum(m.nbytes / max(1, m.shape[0] * m.shape[-2]) for m in kv_metas if len(m.shape) >= 2)
    context = max((round(max(sizes.get(m.storage, 0), m.nbytes) / (m.nbytes / m.shape[-2]))
                   for m in kv_metas if len(m.shape) >= 2 and m.nbytes), default=0)
    weights = sum(max(sizes.get(s, 0), metas[s].nbytes) for s in _read_only(records, phases.decode) - kv)
    batch = kv_metas[0].shape[0] if kv_metas and len(kv_metas[0].shape) == 4 else 0
    return Footprint(weights, kv_bytes, per_token, context, kv_metas[0].dtype if kv_metas else "",
                     len(kv_metas), bool(persistent), batch)


def _updated_in_place(records: Sequence[Record], spans: Sequence[Span], step_of: Callable[[int], int | None],
                      metas: dict[int, Any]) -> set[int]:
    """Storages of 4-D tensors that every decode step writes (``index_copy_``, ``index_put_``, ``copy_`` into the
    cache) and that no step allocates: a static KV cache, behind ``repeat_kv`` copies or matmul attention."""
    written: dict[int, set[int]] = {}
    born: set[int] = set()
    for rec in records:
        step = step_of(rec.seq)
        if step is None:
            continue
        if isinstance(rec, MemoryRecord) and rec.event == "alloc":
            born.add(rec.storage)
        elif isinstance(rec, OpRecord):
            for t in (*rec.outputs, *(rec.inputs[:1] if _in_place(rec) else ())):
                if len(t.shape) == 4 and min(t.shape[-2:]) > 1:      # [batch, heads, context, head_dim], no mask
                    written.setdefault(t.storage, set()).add(step)
                    metas[t.storage] = t
    return {s for s, steps in written.items() if len(steps) == len(spans) > 1 and s not in born}


def _grown_caches(records: Sequence[Record], spans: Sequence[Span], step_of: Callable[[int], int | None]) -> list:
    """The 4-D outputs of the last decode step's ``cat``s that are one token longer (dim -2) than the same cat's
    (by order in the step) in the step before: a dynamic KV cache, as it stands at the end."""
    if len(spans) < 2:
        return []
    last, before = len(spans) - 1, len(spans) - 2
    cats: dict[int, list] = {last: [], before: []}
    for rec in records:
        step = step_of(rec.seq)
        if step in cats and isinstance(rec, OpRecord) and base_name(rec.op) == "cat" and rec.outputs \
                and len(rec.outputs[0].shape) == 4:
            cats[step].append(rec.outputs[0])
    return [new for old, new in zip(cats[before], cats[last]) if old.shape[:-2] == new.shape[:-2]
            and old.shape[-1] == new.shape[-1] and new.shape[-2] == old.shape[-2] + 1]


def hbm_capacity(trace: Trace, chip: ChipSpec) -> tuple[int, str]:
    """A chip's HBM as the run had it, and where that number comes from: the capacity its device was configured
    with (TPUSIM_HBM_BYTES, the one an out-of-memory error is raised at) when the recording ran on this chip with
    another than the datasheet's; else the datasheet's. A decode loop that ran out of a configured 61 MiB was
    reported as fitting in the datasheet's 95 GiB (issue 44, IN1)."""
    per_device = trace.meta.hbm_bytes
    if trace.meta.chip == chip.name and per_device and per_device != chip.hbm_bytes // chip.devices_per_chip:
        return per_device * chip.devices_per_chip, "the run's TPUSIM_HBM_BYTES"
    return chip.hbm_bytes, ""


def fits_section(fp: Footprint, batch: int, chip: ChipSpec, chips: int,
                 capacity: tuple[int, str] | None = None) -> dict[str, Any]:
    """The largest batch x context the chip's HBM (``capacity``: bytes per chip, where from; default the
    datasheet's) holds beside the weights (weights and KV cache only)."""
    hbm, source = capacity or (chip.hbm_bytes, "")
    free = hbm - fp.weights_bytes
    context, per_token = fp.kv_context, fp.kv_bytes_per_token
    needed = fp.weights_bytes + batch * context * per_token
    max_batch = max(0, math.floor(free / (per_token * context))) if per_token and context else None
    max_context = max(0, math.floor(free / (per_token * batch))) if per_token and batch else None
    fits = needed <= hbm
    head = (f"batch {batch} at context {context} {'fits' if fits else 'does not fit'} "
            f"({format_bytes(needed)} of {format_bytes(hbm)} HBM per chip{f' ({source})' if source else ''} "
            f"with the weights)")
    tail = f"; at context {context} the largest batch is {max_batch}" if max_batch is not None else ""
    if max_batch is not None and chips > 1:
        tail += f" per chip ({max_batch * chips} per slice of {chips} replicas)"
    return {"hbm_bytes": hbm, "needed_bytes": needed, "fits": fits, "batch": batch, "context": context,
            "max_batch_at_context": max_batch, "max_context_at_batch": max_context, "line": head + tail}


# ---- per mode --------------------------------------------------------------------------------------------------------
DeviceSplit = Callable[[Timeline, float, float, int], dict[str, float]]


def mode_section(timeline: Timeline, trace: Trace, chip: ChipSpec, phases: Phases, fp: Footprint, world_size: int,
                 device_split: DeviceSplit, cause: str = "") -> dict[str, Any] | None:
    """One mode's inference numbers (module docstring); None when no decode step ran any device work. ``cause``:
    why the decode steps' shapes change (``shape_cause``), named when they compile every step."""
    first_chip = timeline.chips_simulated[0] if timeline.chips_simulated else 0
    tokens = token_steps(timeline, phases.prefill, phases.decode, first_chip)
    if tokens is None:
        return None
    prefill, steps_s, start, previous = tokens.prefill, list(tokens.steps_s), tokens.start_s, tokens.end_s
    decode_s = previous - start
    tpot = median(steps_s)
    p90 = quantiles(steps_s, n=10, method="inclusive")[-1] if len(steps_s) > 1 else tpot
    shared = any(isinstance(r, CollectiveRecord) for r in trace.records)
    steady = tokens.steady_s
    per_replica = phases.batch * len(steady) / sum(steady) if sum(steady) else None
    roofline = (fp.weights_bytes + fp.kv_bytes) / chip.hbm_bytes_per_s
    warm = tokens.steady_start_s                                  # the first step compiles what decode runs: warm-up
    decode = {**_phase(timeline, trace, chip, warm, previous, len(steady), tpot, world_size,
                       device_split), "time_s": decode_s}
    pre = (_phase(timeline, trace, chip, prefill[0], prefill[1], 1, prefill[1] - prefill[0], world_size, device_split)
           if prefill else None)
    ratio = tpot / roofline if roofline else None
    collectives = _decode_collectives(timeline, phases.decode[1:] or phases.decode, first_chip, warm, previous,
                                      len(steady), tpot, device_split)
    compiles = decode_compiles_per_step(timeline, phases.decode, first_chip)
    line = (f"decode {decode['bound'] or 'idle'}-bound; a token step takes {seconds_text(tpot)}, "
            + (f"{ratio:.3g}x the HBM roofline of reading the weights ({format_bytes(fp.weights_bytes)}) and the KV "
               f"cache ({format_bytes(fp.kv_bytes)}) once at {chip.hbm_bytes_per_s / 1e9:,.0f} GB/s "
               f"({seconds_text(roofline)})" if ratio else "no weights or KV cache found to set a roofline")
            + recompiling_words(compiles, cause))
    return {
        "ttft_s": prefill[1] - prefill[0] if prefill else None,
        "tpot_median_s": tpot,
        "tpot_p90_s": p90,
        "decode_steps_s": steps_s,
        "decode_s": decode_s,
        "tokens_per_s_per_chip": (per_replica / world_size if shared else per_replica) if per_replica else None,
        "tokens_per_s_per_slice": (per_replica if shared else per_replica * world_size) if per_replica else None,
        "roofline_step_s": roofline,
        "roofline_ratio": ratio,
        "prefill": pre,
        "decode": decode,
        "decode_compiles_per_step": compiles,
        "verdict": line,
        **collectives,
    }


def decode_compiles_per_step(timeline: Timeline, spans: Sequence[Span], chip: int) -> float | None:
    """Compile-cache misses per token step after the first (which compiles what the loop runs: warm-up); None with
    a single step. A decode loop whose shapes stay the same compiles none; one whose shapes grow compiles every step,
    in every mode (Strict: each op's program; Fused: each cluster), with no recompile at a marked step to count it."""
    steady = spans[1:]
    if not steady:
        return None
    index = span_index(steady)
    found = sum(1 for e in timeline.events if e.kind == "compile" and e.chip == chip and index(e.seq) is not None)
    return found / len(steady)


def shape_cause(records: Sequence[Record]) -> str:
    """Why a decode step's shapes differ from the last one's, in words: the op whose input grows by one each step
    (fused_lint's ``growing_op``: a cache grown by ``cat`` or attention over a longer slice of one), else ""."""
    growth = growing_op(records)
    if growth is not None:
        _, op, dim = growth
        return f"{base_name(op.op)} at {op.source} reads an input one longer along dim {dim} each step"
    return _growing_key_or_value(records)


def _growing_key_or_value(records: Sequence[Record]) -> str:
    """An attention call whose K or V (inputs 1 and 2: a cache sliced to the tokens so far, ``K[..., :pos]``)
    grows by one along one dim from one call at its line to the next, ``MIN_DETECTED_STEPS`` times in a row."""
    last: dict[tuple[str, int], tuple[tuple[int, ...], int, int]] = {}    # (line, input) -> (shape, dim, run)
    for rec in records:
        if not isinstance(rec, OpRecord) or rec.program or rec.family != Family.ATTENTION:
            continue
        for i, meta in enumerate(rec.inputs[1:3], 1):
            shape, dim, run = last.get((rec.source, i), ((), -1, 0))
            if meta.shape == shape:
                continue
            grown = grown_dim(shape, meta.shape) if shape else None
            if grown is None:
                run, dim = 0, -1
            elif grown == dim:
                run += 1
            else:
                run, dim = 1, grown
            last[(rec.source, i)] = (meta.shape, dim, run)
            if run >= MIN_DETECTED_STEPS:
                return (f"{base_name(rec.op)} at {rec.source} reads a {'KV'[i - 1]} one longer along dim {dim} "
                        f"each step")
    return ""


def recompiling_words(per_step: float | None, cause: str) -> str:
    """The verdict's clause for a decode loop that compiles every token step: the cause, the count, the fix (in every
    mode: Strict compiles each op anew, Fused each cluster); "" when the steps after the first compile nothing."""
    if not per_step or per_step < 1:
        return ""
    return (f"; every token step compiles {per_step:.3g} programs anew: new shapes each step"
            + (f" ({cause})" if cause else "")
            + ". Fix: a static KV cache (preallocated, written in place) and the decode step under torch.compile: one "
              "program for every step (docs/inference.md, the Fused eager decode trap)")


def _decode_collectives(timeline: Timeline, spans: Sequence[Span], chip: int, start: float, end: float, count: int,
                        tpot: float, device_split: DeviceSplit) -> dict[str, Any]:
    """Tensor-parallel decode's collectives: per token step, the time they keep the chip waiting (exposed: the
    headline's ``collective_exposed`` over the steady decode window), its share of TPOT, and the share of their time
    that is the closed form's latency term (start-up + hops x hop latency) rather than bytes / bandwidth: small
    all-reduces are latency-bound. All None when no collective runs in a decode step."""
    index = span_index(spans)
    runs = [c for c in timeline.collectives if c.chip == chip and index(c.seq) is not None]
    if not runs:
        return dict.fromkeys(("decode_collective_s", "decode_collective_share", "decode_collective_latency_share"))
    exposed = device_split(timeline, start, end, count)["collective_exposed"]
    took = sum(c.result.time_s for c in runs)
    latency = sum(min(c.result.latency_s, c.result.time_s) for c in runs)
    return {"decode_collective_s": exposed, "decode_collective_share": exposed / tpot if tpot else None,
            "decode_collective_latency_share": latency / took if took else None}


def _phase(timeline: Timeline, trace: Trace, chip: ChipSpec, start: float, end: float, count: int, step_s: float,
           world_size: int, device_split: DeviceSplit) -> dict[str, Any]:
    """A phase's time, utilisation and bound: the headline's, over its window as ``count`` steps."""
    steps = Steps(count, 0, (), "", step_s, start, end)
    head = headline(timeline, trace, chip, steps, device_split(timeline, start, end, count), world_size, None, set())
    chips = max(1, len(timeline.chips_simulated))
    moved = sum(e.bytes for e in timeline.events if e.kind == "op" and start <= e.start_s < end) / chips
    span = end - start
    return {"time_s": span, "hfu": head["hfu"], "hbm_utilisation":
            moved / (span * chip.hbm_bytes_per_s) if span else 0.0, "bound": head["bound"],
            "bound_shares": head["bound_shares"], "verdict": head["verdict"]}


def inference_section(trace: Trace, timelines: dict[str, Timeline], chip: ChipSpec, world_size: int,
                      device_split: DeviceSplit) -> dict[str, Any] | None:
    """report.json ``inference``: None for a program without decode steps (a training run's report is unchanged)."""
    phases = find_phases(trace)
    if phases is None:
        return None
    records = next(iter(rank_records(trace).values()), ())
    fp = footprint(records, phases)
    if not phases.batch:        # marked phases whose attention is written as matmuls: the cache's sequences
        phases = dataclasses.replace(phases, batch=fp.kv_batch or 1)
    cause = shape_cause(records)
    modes = {name: section for name, timeline in timelines.items()
             if (section := mode_section(timeline, trace, chip, phases, fp, world_size, device_split, cause))
             is not None}
    kv = None
    if fp.kv_tensors:
        kv = {"bytes": fp.kv_bytes, "bytes_per_sequence": fp.kv_bytes / phases.batch,
              "bytes_per_token": fp.kv_bytes_per_token, "context": fp.kv_context, "dtype": fp.kv_dtype,
              "tensors": fp.kv_tensors, "static": fp.kv_persistent}
    replicas = 1 if any(isinstance(r, CollectiveRecord) for r in trace.records) else world_size
    return {"phases_from": phases.found_by, "batch": phases.batch, "prompt_tokens": phases.prompt_tokens,
            "decode_steps": len(phases.decode), "weights_bytes": fp.weights_bytes, "kv_cache": kv,
            "fits": fits_section(fp, phases.batch, chip, replicas, hbm_capacity(trace, chip)) if kv else None,
            "modes": modes}
