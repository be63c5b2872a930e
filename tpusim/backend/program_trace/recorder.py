"""Recording the program trace (tpusim.trace.records) while a tpu program runs.

Usage::

    import tpusim.backend as tb
    with tb.recording() as rec:
        loss = model(x).sum(); loss.backward(); opt.step()   # opt.step() adds a StepMarker
    trace = rec.trace                                         # a tpusim.trace.records.Trace

What is recorded: one ``OpRecord`` per op the fallback runs (unit, FLOPs, transcendentals,
bytes from the op table, tpusim/trace/ops.py; tensors with ids and storage ids, so views show as aliasing),
device-to-device copies as DMA ops, ``HostRecord`` for host syncs (``.item()``, ``.cpu()``,
printing, ``torch.tpu.synchronize()``) and host<->device copies, ``MemoryRecord`` for every
device allocation and free, and ``StepMarker`` at each ``optimizer.step()`` or
``tpusim.backend.step()``. Layers above add through public calls and are never called back by
name: ``record_collective`` (the c10d backend), ``set_meta`` (facts for ``trace.meta``),
``add_meta_source`` (facts computed when a recording stops: torch.compile's graph breaks, from
tpusim/backend/torch_compile/jax_backend.py) and ``add_step_listener`` (told of every explicit ``step()``: the measured
run's clock). When no recording is active the fallback pays one attribute check. A
torch.compile'd graph's execution is recorded as its ops (``record_program``,
tpusim/backend/program_trace/compiled_program.py), numbered by ``OpRecord.program`` so the simulator prices
them as one XLA program.

The record budget (``TPUSIM_MAX_RECORDS``, ``tpusim run --max-records``): a long-running script's trace
grows about 1 KiB a record, so once a step ends with the budget reached the recorder stops storing
(``_stop_storing``), counts the steps after, and the report prices the steps recorded with a note. A
recording that has marked no step yet has no step to stop at: it stops at the drain that reaches the budget
(``_drain``), its trace cut to exactly the budget (a prefix of the program). Ops the shim runs natively log
without calling Python, so while no step is marked ``_watch_budget`` drains every ``WATCH_S`` from a thread
(nothing per op).

Tensor ids: a tensor is identified by (storage id, offset, shape, strides): two Python objects
viewing the same bytes the same way are the same tensor for dataflow purposes.

Where the work is done: the device logs what happens natively (tpusim/backend/csrc/record.cpp):
allocations and frees, the ops its C++ fallback ran (with their tensor metas and source lines),
copies and host syncs, in order, and makes their records when this module drains the log
(``_drain``), which it does before it appends a record of its own, so the trace keeps the order
things happened in. Costs of ops whose rule reads more than their tensors' sizes come with the log
(``shaped_cost``, asked at the op); the others are ``costs.counted_cost``'s, asked by the shim once
per (op, element counts).
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from tpusim import envvars
from tpusim.backend.aten import float64_policy
from tpusim.backend.plumbing.source import user_source
from tpusim.backend.plumbing.state import STATE
from tpusim.backend.program_trace import costs, op_programs
from tpusim.backend.program_trace.compiled_program import Program
from tpusim.eager import state as eager
from tpusim.eager.windows import BACKWARD_REASON
from tpusim.trace.ops import Family, family_of
from tpusim.trace.records import (
    CollectiveRecord,
    HostRecord,
    MemoryRecord,
    OpRecord,
    Record,
    StepMarker,
    TensorMeta,
    Trace,
    TraceMeta,
    XlaModule,
    renumber,
)


@dataclass
class Recording:
    """Handle returned by ``recording()``; ``trace`` is set when the block exits."""

    meta: TraceMeta = field(default_factory=TraceMeta)
    records: list[Record] = field(default_factory=list)
    trace: Trace | None = None
    steps: int = 0
    metas: list[TensorMeta] = field(default_factory=list)   # the shim's tensor metas, by index
    lock: threading.Lock = field(default_factory=threading.Lock)
    programs: int = 0               # compiled-program executions recorded (OpRecord.program numbers)
    program_runs: dict[int, tuple[Program, list[int]]] = field(default_factory=dict)   # id -> its executions
    graph_runs: dict[int, tuple[WholeGraph, list[int]]] = field(default_factory=dict)  # id -> first segments' numbers
    op_calls: dict[str, tuple[str, tuple]] | None = None   # TPUSIM_XLA_OPS: op signature -> its first call
    synthetic_storages: int = 0     # storages of values that never leave a compiled program
    updated_in_place: dict[int, int] = field(default_factory=dict)  # a program output's storage -> the input's
    #                                 storage it updates (Program.updated_inputs): the write-back copy is free
    max_records: int = 0            # the record budget (TPUSIM_MAX_RECORDS; 0: none): see _over_budget
    stopped_after_step: int | None = None   # the budget stopped storing after this step (steps counts on;
    #                                         0: before any step, the trace a prefix of the program)
    kept: int | None = None         # the records the trace keeps once the budget stopped storing
    done: threading.Event = field(default_factory=threading.Event)   # set at stop: the budget's watcher ends


_ACTIVE: Recording | None = None
_FULL: Recording | None = None      # a recording whose budget was reached: it counts steps and stores nothing
_HOOK_HANDLE = None
_META_SOURCES: list[Callable[[], dict]] = []
_STEP_LISTENERS: list[Callable[[], None]] = []


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype)[6:]


def _maker(cls: type) -> Callable[..., Record]:
    """Make records of the frozen dataclass ``cls`` from its field values in order (the rest take their
    defaults): the same object ``cls(...)`` makes, without the per-field ``object.__setattr__`` a frozen
    dataclass's __init__ pays (about 4 us an OpRecord: the recorder's largest cost per op). Only for values
    __post_init__ would keep as they are (an OpRecord's family given)."""
    names = [f.name for f in dataclasses.fields(cls)]
    defaults = {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
    new = object.__new__

    def make(*values: object) -> Record:
        record = new(cls)
        fields = record.__dict__
        fields.update(defaults)
        fields.update(zip(names, values))
        return record

    return make


_OP_RECORD = _maker(OpRecord)
_UNITS: dict[Family, str] = {}
_COPY_FAMILY = str(family_of("aten::copy_"))


def _metas(rec: Recording, tensors: list[torch.Tensor]) -> tuple[TensorMeta, ...]:
    if not tensors:
        return ()
    new, indices = STATE.shim.record_metas(tensors)   # tensor metas the shim made since it was last asked
    rec.metas += new
    return tuple(map(rec.metas.__getitem__, indices))


def _drain(rec: Recording) -> None:
    """Append the shim's log (tpusim/backend/csrc/record.cpp) since the last drain, its records made there as
    ``_op_record`` would make them (costs without a shaped rule from ``costs.counted_cost``, asked once per
    signature); call with ``rec.lock`` held."""
    before = len(rec.records)
    new, records = STATE.shim.record_drain(before)
    if new:
        rec.metas += new
    rec.records += records
    if not rec.steps and 0 < rec.max_records <= len(rec.records) and rec.kept is None:
        _stop_storing(rec, max(before, rec.max_records))     # no step to stop at: cut inside what was drained


def _flatten(out: object, acc: list[torch.Tensor]) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        acc.append(out)
    elif isinstance(out, (list, tuple)):
        for o in out:
            _flatten(o, acc)
    return acc


def record_op(op: object, name: str, inputs: list[torch.Tensor], out: object, args: tuple, kwargs: dict,
              mutated: list[torch.Tensor]) -> None:
    """One op the fallback ran (called only while recording)."""
    rec = _ACTIVE
    if rec is None:
        return
    outs = _flatten(out, [])
    for m in mutated:
        if not any(m is o for o in outs):
            outs.append(m)
    outs = [o for o in outs if o.device.type == "tpu"]
    cost = shaped_cost(name, inputs, outs, args)
    source = user_source()
    with rec.lock:
        _drain(rec)
        rec.records.append(_op_record(name, cost, _metas(rec, inputs), _metas(rec, outs), source,
                                      seq=len(rec.records)))


def shaped_cost(name: str, inputs: list[torch.Tensor], outs: list[torch.Tensor], args: tuple) -> costs.OpCost:
    """An op's cost from its device tensors and positional arguments (the shim asks at the op for the ops
    whose rule reads them, and for every op when the TPU compiler wants each op's program:
    ``op_programs.asked_at_op``)."""
    rec = _ACTIVE
    if rec is not None and rec.op_calls is not None:
        try:
            op_programs.note(rec.op_calls, name, inputs, outs, args)
        except Exception:  # never break the user's program: this op is then priced by the model
            pass
    try:
        return costs.op_cost(name, inputs, outs, args)
    except Exception:  # a cost rule must never break the user's program
        return costs.OpCost(Family.ELEMENTWISE)


def _op_record(name: str, cost: costs.OpCost, ins: tuple[TensorMeta, ...], outs: tuple[TensorMeta, ...], source: str,
               program: int = 0, seq: int = 0) -> OpRecord:
    """An op's record; bytes default to its tensors' sizes where the cost rule leaves them open."""
    read = cost.bytes_read if cost.bytes_read is not None else sum([m.nbytes for m in ins])
    written = cost.bytes_written if cost.bytes_written is not None else sum([m.nbytes for m in outs])
    dtype = cost.dtype or ((outs or ins)[0].dtype if (outs or ins) else "float32")
    family = cost.family
    unit = _UNITS.get(family) or _UNITS.setdefault(family, cost.unit)
    return _OP_RECORD(seq, name, unit, dtype, ins, outs, cost.flops, cost.transcendentals, float(read),
                      float(written), cost.matmul, source, 0, program, family)


def record_program(program: Program, inputs: list, outputs: list) -> None:
    """One execution of a compiled graph (torch_compile/jax_backend.py): its ops as ``OpRecord``s sharing a fresh
    ``program`` number. Graph inputs and outputs are the real tensors (so eager ops before and after
    connect to them); values that never leave the graph get storages of their own (negative ids),
    allocated before their first op and freed after their last."""
    rec = _ACTIVE
    if rec is None:
        return
    source = user_source()
    with rec.lock:
        _drain(rec)
        rec.programs += 1
        rec.program_runs.setdefault(id(program), (program, []))[1].append(rec.programs)
        real: dict[int, TensorMeta] = {}
        for value, t in (*zip(program.inputs, inputs), *zip(program.outputs, outputs)):
            if value is not None and isinstance(t, torch.Tensor) and t.device.type == "tpu":
                real[value] = _metas(rec, [t])[0]
        # A real tensor's storage is its base's, also when the base never leaves the graph (an output that is
        # a view of an intermediate): the ops writing that base write the real storage.
        real_base = {program.values[v].base: meta.storage for v, meta in real.items()}
        storage: dict[int, int] = {}
        for v, value in enumerate(program.values):     # a view's base comes before it
            if value.base in real_base:
                storage[v] = real_base[value.base]
            elif value.base != v:
                storage[v] = storage[value.base]
            else:
                rec.synthetic_storages += 1
                storage[v] = -rec.synthetic_storages
        metas = {v: real.get(v) or _program_meta(rec, program, v, storage[v]) for v in storage}
        for out, inp in program.updated_inputs():
            if out in real and inp in real:
                rec.updated_in_place[real[out].storage] = real[inp].storage
        allocs, frees = _lifetimes(program, storage)
        records = rec.records
        for i, op in enumerate(program.ops):
            records += [MemoryRecord(len(records) + k, "alloc", s, n) for k, (s, n) in enumerate(allocs.get(i, ()))]
            records.append(_op_record(op.name, op.cost, tuple(metas[v] for v in op.reads),
                                      tuple(metas[v] for v in op.writes), op.source or source, rec.programs,
                                      seq=len(records)))
            records += [MemoryRecord(len(records) + k, "free", s, n) for k, (s, n) in enumerate(frees.get(i, ()))]


class WholeGraph(Protocol):
    """A graph with collectives lowered whole for the TPU compiler (torch_compile/jax_backend.py's ``SpmdGraph``)."""

    label: str
    devices: int
    segments: int

    def stablehlo(self) -> str: ...


_GRAPH_RUN = 0      # while a graph with collectives runs: the program number of its first segment


@contextmanager
def graph_run(graph: WholeGraph) -> Iterator[None]:
    """One run of a graph with collectives: the collectives recorded meanwhile carry its first segment's
    program number (``CollectiveRecord.program``), and the run is listed for the TPU compiler."""
    global _GRAPH_RUN
    rec = _ACTIVE
    first = 0 if rec is None else rec.programs + 1
    _GRAPH_RUN = first
    try:
        yield
    finally:
        _GRAPH_RUN = 0
    if rec is not None and rec.programs >= first:
        with rec.lock:
            rec.graph_runs.setdefault(id(graph), (graph, []))[1].append(first)


def _program_meta(rec: Recording, program: Program, v: int, storage: int) -> TensorMeta:
    value = program.values[v]
    tid = STATE.shim.record_tensor_id()
    return TensorMeta(tid, value.shape, _dtype_name(value.dtype), value.nbytes, storage)


def _lifetimes(program: Program, storage: dict[int, int]) -> tuple[dict[int, list], dict[int, list]]:
    """op index -> [(synthetic storage, bytes)] to allocate before it, and to free after it."""
    first: dict[int, tuple[int, int]] = {}
    last: dict[int, int] = {}
    for i, op in enumerate(program.ops):
        for v in (*op.reads, *op.writes):
            if storage[v] < 0:
                first.setdefault(storage[v], (i, program.values[program.values[v].base].nbytes))
                last[storage[v]] = i
    allocs: dict[int, list] = {}
    frees: dict[int, list] = {}
    for s, (i, nbytes) in first.items():
        allocs.setdefault(i, []).append((s, nbytes))
        frees.setdefault(last[s], []).append((s, nbytes))
    return allocs, frees


def recorded() -> list[Record]:
    """The active recording's records so far (the shim's log drained first); empty when none records."""
    rec = _ACTIVE
    if rec is None:
        return []
    with rec.lock:
        _drain(rec)
        return list(rec.records)


def record_host(event: str, reason: str, nbytes: int = 0) -> None:
    rec = _ACTIVE
    if rec is None:
        return
    source = user_source()
    with rec.lock:
        _drain(rec)
        rec.records.append(HostRecord(len(rec.records), event, reason, nbytes, 0.0, source))


def record_collective(kind: str, nbytes: int, group: tuple[int, ...], inputs: list[torch.Tensor],
                      outputs: list[torch.Tensor], mesh_axis: str = "", reduce_op: str = "", dtype: str = "float32",
                      async_op: bool = False, source: str | None = None) -> None:
    """One collective (called by the c10d backend, tpusim/backend/distributed/): its tensors get the same ids
    as the op records', so ops reading a collective's output wait for it in the simulator."""
    rec = _ACTIVE
    if rec is None:
        return
    where = user_source() if source is None else source
    with rec.lock:
        _drain(rec)
        ins = _metas(rec, [t for t in inputs if t.device.type == "tpu"])
        outs = _metas(rec, [t for t in outputs if t.device.type == "tpu"])
        rec.records.append(CollectiveRecord(len(rec.records), kind, int(nbytes), tuple(group), ins, outs, mesh_axis,
                                            reduce_op, dtype, async_op, where, program=_GRAPH_RUN))


def set_meta(key: str, value: object) -> None:
    """Set field ``key`` of the active recording's ``TraceMeta`` (no-op when nothing records): facts only a
    layer above the recorder knows, such as DeviceMesh layouts and --ranks one caveats."""
    rec = _ACTIVE
    if rec is not None:
        with rec.lock:
            rec.meta = rec.meta.replace(**{key: value})


def add_meta_source(source: Callable[[], dict]) -> None:
    """Call ``source()`` each time a recording stops; the trace meta fields it returns (name -> value)
    are set after the device's own: facts a layer above the recorder gathers (idempotent per source)."""
    if source not in _META_SOURCES:
        _META_SOURCES.append(source)


def _add(listeners: list[Callable[[], None]], listener: Callable[[], None]) -> None:
    if listener not in listeners:
        listeners.append(listener)


def _remove(listeners: list[Callable[[], None]], listener: Callable[[], None]) -> None:
    if listener in listeners:
        listeners.remove(listener)


def add_step_listener(listener: Callable[[], None]) -> None:
    """Call ``listener()`` after every explicit ``step()`` (``tpusim.backend.step()``), recording or not."""
    _add(_STEP_LISTENERS, listener)


def remove_step_listener(listener: Callable[[], None]) -> None:
    _remove(_STEP_LISTENERS, listener)


def step() -> None:
    """Mark a training-step boundary (optimizer.step() does this automatically while recording)."""
    _mark_step()
    for listener in list(_STEP_LISTENERS):
        listener()


def _mark_step() -> None:
    rec = _ACTIVE
    if rec is None:
        if _FULL is not None:       # over budget: the steps after the stop are counted, not recorded
            _FULL.steps += 1
        return
    source = user_source()
    with rec.lock:
        _drain(rec)
        rec.steps += 1
        if rec.kept is not None:    # that drain reached the budget before this first step: counted only
            return
        rec.records.append(StepMarker(len(rec.records), rec.steps, source))
        full = _over_budget(rec)
    if full:
        _stop_storing(rec, len(rec.records))


def _over_budget(rec: Recording) -> bool:
    """Why a budget: the trace is the program, about 1 KiB a record in memory (benchmarks/
    bench_record_memory.py), so a long run's recording would grow without bound; checked at step boundaries
    so the trace ends with whole steps, which price like the ones after them."""
    return 0 < rec.max_records <= len(rec.records)


def _stop_storing(rec: Recording, kept: int) -> None:
    """Stop recording for good (the device's log too) but keep counting steps; the script runs on with
    the same numerics, since recording never changes a value. The trace keeps its first ``kept`` records
    (a caller inside ``rec.lock`` may still append its own after the drain that stopped: left out)."""
    global _ACTIVE, _FULL
    runs_on = STATE.recording                   # False when ``stop``'s last drain reached the budget
    STATE.recording = False
    STATE.shim.record_stop()
    rec.stopped_after_step = rec.steps
    rec.kept = kept
    del rec.records[kept:]
    _ACTIVE, _FULL = None, rec
    print(f"tpusim: {budget_note(rec.stopped_after_step, None, rec.max_records, kept)}"
          f"{'; the script runs on' if runs_on else ''}", file=sys.stderr, flush=True)


def budget_note(step: int, steps: int | None, max_records: int, records: int = 0) -> str:
    """The words users see in the summary, report.json and on stderr when the budget stopped recording
    after step ``step`` of ``steps`` (None: not known yet); ``step`` 0: before any step, after ``records``."""
    budget = (f"record budget {max_records:,} records; raise it with TPUSIM_MAX_RECORDS or tpusim run "
              f"--max-records, 0 for no limit")
    if step:
        of = f" of {steps}" if steps is not None else ""
        return f"recording stopped after step {step}{of} ({budget})"
    why = ("no step marked yet" if steps is None else "the script marks no steps" if not steps
           else f"before the first of the {steps:,} steps the script marked")
    return (f"recording stopped after {records:,} records ({why}: the report prices the program's first "
            f"{records:,} records, not the whole program; {budget})")


WATCH_S = 0.25      # how often a recording with no step yet drains the shim's log to check its budget


def _watch_budget(rec: Recording) -> None:
    """Drain every ``WATCH_S`` until the first step (then steps are the boundaries) or the end: ops the shim
    runs natively never call Python, so without this the log of a script that marks no steps would grow
    unchecked until ``stop``."""
    while not rec.done.wait(WATCH_S):
        with rec.lock:
            if rec.steps or rec.kept is not None or _ACTIVE is not rec:
                return
            _drain(rec)


def _optimizer_hook(optimizer: torch.optim.Optimizer, args: object, kwargs: object) -> None:
    """An optimizer step ends a training step only when it updates tpu parameters: a CPU model trained
    beside the tpu one (a reference run, a teacher) is not the program's step."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if any(p.device.type == "tpu" for p in params):
        rec = _ACTIVE
        if rec is not None and rec.meta.trained_parameters is None:   # once: numel of a DTensor is its global size
            unique = {id(p): p for p in params if p.device.type == "tpu"}
            set_meta("trained_parameters", sum(p.numel() for p in unique.values()))
        _mark_step()


def start(meta: dict[str, object] | None = None, max_records: int | None = None) -> Recording:
    """Start recording; ``max_records`` is the record budget (None: TPUSIM_MAX_RECORDS or its default;
    0: no limit): once a step ends with that many records, recording stops and only steps are counted; before
    any step, recording stops at exactly that many records."""
    global _ACTIVE, _HOOK_HANDLE
    if _ACTIVE is not None or _FULL is not None:
        raise RuntimeError("tpusim: a recording is already active; nest no recordings")
    budget = int(envvars.read("TPUSIM_MAX_RECORDS")) if max_records is None else max_records
    rec = Recording(meta=TraceMeta(eager_mode=eager.get_eager_mode()).replace(**(meta or {})),  # the mode it started in
                    max_records=budget, op_calls={} if op_programs.enabled() else None)
    STATE.shim.record_classes(MemoryRecord, TensorMeta, OpRecord, HostRecord, costs.counted_cost, _COPY_FAMILY)
    STATE.shim.record_start()
    _HOOK_HANDLE = register_optimizer_step_post_hook(_optimizer_hook)
    _ACTIVE = rec
    STATE.recording = True
    if budget:
        threading.Thread(target=_watch_budget, args=(rec,), name="tpusim-record-budget", daemon=True).start()
    return rec


def _in_place(record: Record, updated: dict[int, int]) -> Record:
    """AOT autograd's write-back ``input.copy_(output)`` of an input a compiled program updated: XLA updated it in
    its buffer (Program.updated_inputs), so the copy moves no bytes; every other record as it is."""
    if not (isinstance(record, OpRecord) and record.op == "aten::copy_" and record.inputs and record.outputs
            and updated.get(record.inputs[-1].storage) == record.outputs[0].storage):
        return record
    return dataclasses.replace(record, bytes_read=0.0, bytes_written=0.0, flops=0.0)


def stop() -> Trace:
    global _ACTIVE, _FULL, _HOOK_HANDLE
    rec = _ACTIVE or _FULL
    if rec is None:
        raise RuntimeError("tpusim: no recording is active")
    STATE.recording = False
    rec.done.set()                               # the budget's watcher (if any) ends
    if _ACTIVE is not None:
        with rec.lock:
            _drain(rec)
    STATE.shim.record_stop()
    if _HOOK_HANDLE is not None:
        _HOOK_HANDLE.remove()
        _HOOK_HANDLE = None
    _ACTIVE = _FULL = None
    cfg = STATE.config
    meta = TraceMeta(device="tpu", chip=cfg.chip.name, devices=cfg.device_count, hbm_bytes=cfg.hbm_bytes,
                     numerics=cfg.numerics, f64_ops=tuple(float64_policy.non_native_ops()))
    host_peak = STATE.shim.record_host_peak()    # host memory offloaded tensors held (dispatch/offload.py)
    if host_peak:
        meta = meta.replace(host_peak_bytes=host_peak)
    meta = meta.replace(**rec.meta.set_fields())  # what layers above set wins
    for source in _META_SOURCES:                # e.g. torch.compile's breaks and recompiles (torch_compile/)
        meta = meta.replace(**source())
    # a daemon thread may still issue ops (it took the recording before it stopped) and fill these dicts while they
    # are lowered (issue 44, S07: "dictionary changed size during iteration"): copies, each made in one step under
    # the GIL (dict() of a plain dict runs no Python code)
    op_calls, program_runs, graph_runs = dict(rec.op_calls or {}), dict(rec.program_runs), dict(rec.graph_runs)
    if op_calls:
        meta = meta.replace(xla_ops=tuple(op_programs.lowered(key, name, args)
                                          for key, (name, args) in op_calls.items()))
    if program_runs:
        meta = meta.replace(xla_modules=(*(_xla_module(p, tuple(runs)) for p, runs in program_runs.values()),
                                         *(_whole_module(g, tuple(runs)) for g, runs in graph_runs.values())))
    records = rec.records if rec.kept is None else rec.records[:rec.kept]
    if rec.updated_in_place:
        records = [_in_place(r, rec.updated_in_place) for r in records]
    numbered = all(r.seq == i for i, r in enumerate(records))   # as made: then no copy of each record
    rec.trace = Trace(records=tuple(records) if numbered else renumber(records), world_size=1, rank=0, meta=meta)
    return rec.trace


def _xla_module(program: Program, runs: tuple[int, ...]) -> XlaModule:
    """A compiled graph for the TPU compiler: its StableHLO, or why it has none."""
    if program.stablehlo is None:
        return XlaModule(program.label, programs=tuple(runs), error="not lowered to StableHLO")
    try:
        return XlaModule(program.label, program.stablehlo(), tuple(runs))
    except Exception as error:  # a lowering rule missing for TPU: the model prices this graph, and says why
        return XlaModule(program.label, programs=tuple(runs), error=f"lowering for TPU failed: {error}"[:300])


def _whole_module(graph: WholeGraph, runs: tuple[int, ...]) -> XlaModule:
    """A graph with collectives, lowered whole over its group's devices, or why it could not be."""
    module = XlaModule(graph.label, programs=tuple(runs), devices=graph.devices, segments=graph.segments)
    try:
        return dataclasses.replace(module, stablehlo=graph.stablehlo())
    except Exception as error:  # a collective or op the whole-graph lowering lacks: its segments price it
        return dataclasses.replace(module, error=f"lowering for TPU failed: {error}"[:300])


@contextmanager
def recording(meta: dict[str, object] | None = None, max_records: int | None = None) -> Iterator[Recording]:
    """Record the tpu ops of the block; ``.trace`` of the yielded handle holds the result (``max_records``:
    ``start``'s record budget)."""
    rec = start(meta, max_records)
    try:
        yield rec
    finally:
        stop()


def install() -> None:
    """Nothing to install until a recording starts (kept for symmetry with the other modules)."""


# ---- autograd post-backward: TorchTPU materializes pending work when backward() returns -------------
_BACKWARD_LISTENERS: list[Callable[[], None]] = []


def add_backward_listener(listener: Callable[[], None]) -> None:
    """Call ``listener()`` each time ``torch.autograd.backward`` (so ``Tensor.backward``) returns (wrapped
    once, when this module is imported)."""
    _add(_BACKWARD_LISTENERS, listener)


def remove_backward_listener(listener: Callable[[], None]) -> None:
    _remove(_BACKWARD_LISTENERS, listener)


def _mark_backward() -> None:
    """A zero-second dispatch record (reason ``tpusim.eager.windows.BACKWARD_REASON``): Fused eager's cut."""
    mark_cut(BACKWARD_REASON)


def mark_cut(reason: str) -> None:
    """A zero-second dispatch record whose ``reason`` ends a Fused eager cluster without a host wait
    (``tpusim.eager.windows``: BACKWARD_REASON, LAUNCH_REASON)."""
    rec = _ACTIVE
    if rec is None:
        return
    source = user_source()
    with rec.lock:
        _drain(rec)
        rec.records.append(HostRecord(len(rec.records), "dispatch", reason, 0, 0.0, source))


def _wrap_backward() -> None:
    """Wrap ``torch.autograd.backward`` once (Tensor.backward looks it up at each call), so a listener
    added or removed later needs no re-wrapping and wrappers never stack."""
    original = torch.autograd.backward
    if getattr(original, "_tpusim_wrapped", False):
        return

    @functools.wraps(original)
    def backward(*args: object, **kwargs: object) -> None:
        original(*args, **kwargs)
        _mark_backward()
        for listener in list(_BACKWARD_LISTENERS):
            listener()

    backward._tpusim_wrapped = True  # type: ignore[attr-defined]
    torch.autograd.backward = backward


_wrap_backward()
