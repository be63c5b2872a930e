"""The program trace: the contract between the PyTorch backend and the simulator.

The backend records what a program does once; the simulator prices that record
many times (per eager mode, chip, topology, placement). Records are frozen
dataclasses; on disk a trace is JSON lines: a header line, then one record a line.

Record kinds (the ``kind`` key on disk):

- ``op``          one kernel/op: tensors in and out (ids, shapes, dtypes, bytes,
                  storage ids for aliasing), FLOPs, transcendentals, bytes read and
                  written, the unit that runs it (MXU, VPU, SparseCore, DMA), the
                  matmul shape when it is one, and the user's source line. ``program``
                  > 0 marks the ops of one execution of a torch.compile'd graph: the
                  simulator prices them as one XLA program (tpusim/eager/fusion.py), not as
                  eager ops; 0 (the default, and absent in older traces) is eager.
                  ``family`` is the op's family (tpusim/trace/ops.py), recorded so the simulator
                  never works it out again from the name (older traces: derived from ``op``).
- ``collective``  all_reduce / all_gather / ... : bytes per rank, the process group
                  as ranks and/or a mesh axis name, the reduction, async or not.
- ``host``        host work the device must wait for or that waits for the device:
                  ``sync`` (``.item()``, ``.cpu()``, ``print``, ``synchronize``),
                  ``h2d`` and ``d2h`` copies, explicit ``dispatch`` time. A ``d2h`` with reason
                  ``offload`` keeps an activation on the host (save_on_cpu, a non_blocking or pinned copy).
- ``memory``      ``alloc`` / ``free`` of device storage: the HBM live-bytes timeline.
- ``step``        a training-step boundary (``optimizer.step`` or ``tpusim.step()``).
- (``host`` ``dispatch`` records of zero seconds also mark things that cost nothing: a change of eager mode
  (reason ``eager_mode:<mode>``), ``backward()``, and an inference phase (reason ``phase:prefill``,
  ``phase:decode``, ``phase:end``: ``tpusim.backend.phase``); traces without them load as before.)

Example (two lines of a trace file)::

    {"schema": "tpusim-trace", "version": 1, "world_size": 1, "rank": 0, "records": 1, "meta": {}}
    {"kind": "op", "seq": 0, "op": "aten::mm", "unit": "mxu", "dtype": "bfloat16",
     "inputs": [{"id": 1, "shape": [64, 128], "dtype": "bfloat16", "nbytes": 16384, "storage": 1}, ...],
     "outputs": [...], "flops": 2097152, "transcendentals": 0, "bytes_read": 49152,
     "bytes_written": 32768, "matmul": [1, 64, 128, 128], "source": "model.py:12"}

The header's ``meta`` is a ``TraceMeta`` (end of this module): facts about the whole recording
(the chip, DeviceMesh layouts, --ranks, --placement, torch.compile's graph breaks, float64 ops),
typed, and on disk one JSON key per fact that is set; an unknown key is an error naming the
accepted ones.

Adding a record kind = one dataclass with a ``kind`` class variable, listed in ``RECORD_TYPES``.
Adding a meta fact = one optional field of ``TraceMeta``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from tpusim.errors import TpusimError
from tpusim.trace.ops import Family, family_of

SCHEMA = "tpusim-trace"
SCHEMA_VERSION = 1

UNITS = ("mxu", "vpu", "sparsecore", "dma")
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce",
               "permute", "barrier")
HOST_EVENTS = ("sync", "h2d", "d2h", "dispatch")
OFFLOAD_REASON = "offload"   # reason of a d2h that keeps an activation on the host (tpusim/backend/dispatch/offload.py)
MODE_CHANGE_REASON = "eager_mode:"  # + the new mode: reason of the dispatch record marking a change of eager mode
PHASE_REASON = "phase:"  # + a PHASES name or "end": a zero-second dispatch record marking an inference phase
PHASES = ("prefill", "decode")   # tpusim.backend.phase(); "decode" marks one output-token step of the batch
MEMORY_EVENTS = ("alloc", "free")


@dataclass(frozen=True)
class TensorMeta:
    """A tensor an op touches. Views share ``storage`` with their base (aliasing)."""

    id: int
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    storage: int


@dataclass(frozen=True)
class OpRecord:
    kind: ClassVar[str] = "op"
    seq: int
    op: str
    unit: str
    dtype: str
    inputs: tuple[TensorMeta, ...] = ()
    outputs: tuple[TensorMeta, ...] = ()
    flops: float = 0.0
    transcendentals: float = 0.0
    bytes_read: float = 0.0
    bytes_written: float = 0.0
    matmul: tuple[int, int, int, int] | None = None  # (batch, m, k, n) for MXU work
    source: str = ""
    rank: int = 0
    program: int = 0                # >0: ran inside compiled program execution #program (torch.compile)
    family: str = ""                # tpusim.trace.ops.Family, recorded by the backend; "" (older traces): from ``op``

    def __post_init__(self) -> None:
        if not self.family:
            object.__setattr__(self, "family", str(family_of(self.op)))


@dataclass(frozen=True)
class CollectiveRecord:
    kind: ClassVar[str] = "collective"
    seq: int
    collective: str
    bytes: int                      # bytes of this rank's input buffer
    group: tuple[int, ...] = ()     # global ranks taking part; empty = whole world
    inputs: tuple[TensorMeta, ...] = ()   # what it reads and writes: ops that use the outputs
    outputs: tuple[TensorMeta, ...] = ()  # of an async collective wait for it (overlap otherwise)
    mesh_axis: str = ""             # DeviceMesh dimension name, when the group is one
    reduce_op: str = ""
    dtype: str = "float32"
    async_op: bool = False
    source: str = ""
    rank: int = 0
    program: int = 0                # >0: issued inside a compiled graph's run (its first segment's program number)


@dataclass(frozen=True)
class HostRecord:
    kind: ClassVar[str] = "host"
    seq: int
    event: str
    reason: str = ""                # "item", "cpu", "print", "synchronize", ...
    bytes: int = 0
    seconds: float = 0.0            # measured or modelled host time, for ``dispatch``
    source: str = ""
    rank: int = 0
    # h2d / d2h copies (absent in older traces): the device storage the copy reads (d2h) or writes (h2d); the host
    # buffer, when it is one an offload wrote (d2h reason "offload": tpusim/backend/dispatch/offload.py; 0: none); and
    # whether it was asked non_blocking (the engine runs it on the PCIe link beside compute, no host stall)
    storage: int = 0
    host: int = 0
    non_blocking: bool = False


@dataclass(frozen=True)
class MemoryRecord:
    kind: ClassVar[str] = "memory"
    seq: int
    event: str
    storage: int
    bytes: int
    rank: int = 0


@dataclass(frozen=True)
class StepMarker:
    kind: ClassVar[str] = "step"
    seq: int
    step: int
    source: str = ""
    rank: int = 0


Record = OpRecord | CollectiveRecord | HostRecord | MemoryRecord | StepMarker
RECORD_TYPES: dict[str, type] = {cls.kind: cls for cls in (OpRecord, CollectiveRecord, HostRecord,
                                                           MemoryRecord, StepMarker)}
# kind -> (field whose value is one of a fixed set, that set)
_ENUM_FIELD = {"op": ("unit", UNITS), "collective": ("collective", COLLECTIVES),
               "host": ("event", HOST_EVENTS), "memory": ("event", MEMORY_EVENTS)}


@dataclass(frozen=True)
class Trace:
    """A recorded program: who recorded it, the records in issue order, and facts about the whole
    recording (``TraceMeta``; a plain dict given here is read as the header's JSON form)."""

    records: tuple[Record, ...]
    world_size: int = 1
    rank: int = 0
    meta: TraceMeta = field(default_factory=lambda: TraceMeta())

    def __post_init__(self) -> None:
        if not isinstance(self.meta, TraceMeta):
            object.__setattr__(self, "meta", TraceMeta.from_dict(self.meta))

    def of_kind(self, cls: type) -> list:
        return [r for r in self.records if isinstance(r, cls)]


def record_to_dict(record: Record) -> dict[str, Any]:
    """A record as JSON data: what ``dataclasses.asdict`` gives, five times faster (it deep-copies every leaf),
    so that writing a long run's program.jsonl when SIGTERM arrives fits in a container's grace period."""
    return {"kind": record.kind, **_plain(record)}


_LEAVES = (int, float, str, bool, type(None))
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _plain(value: Any) -> Any:
    """``value`` with every dataclass a dict and every tuple a list (JSON writes both the same)."""
    kind = type(value)
    if kind in _LEAVES:
        return value
    if kind in (tuple, list):
        return [_plain(v) for v in value]
    if kind is dict:
        return {k: _plain(v) for k, v in value.items()}
    names = _FIELD_NAMES.get(kind)
    if names is None:
        if not dataclasses.is_dataclass(value):
            return value
        names = _FIELD_NAMES.setdefault(kind, tuple(f.name for f in dataclasses.fields(value)))
    return {name: _plain(getattr(value, name)) for name in names}


def record_from_dict(data: dict[str, Any], where: str = "record") -> Record:
    """Build a record from its JSON form, naming the field and accepted values on error: every field is
    checked against its type (whole numbers, finite numbers, text, true/false, lists of tensors)."""
    if not isinstance(data, dict):
        raise TpusimError(f"{where}: a record must be a JSON object with a 'kind', not {_short(data)}")
    kind = data.get("kind")
    if not isinstance(kind, str) or kind not in RECORD_TYPES:
        raise TpusimError(f"{where}: unknown kind {_short(kind)}; accepted: {', '.join(RECORD_TYPES)}")
    cls = RECORD_TYPES[kind]
    fields = _record_fields(cls)
    unknown = set(data) - set(fields) - {"kind"}
    if unknown:
        raise TpusimError(f"{where}: unknown field(s) {[k[:40] for k in sorted(unknown)[:5]]} for kind {kind!r}; "
                          f"accepted: {', '.join(fields)}")
    missing = [name for name, (required, _) in fields.items() if required and name not in data]
    if missing:
        raise TpusimError(f"{where}: kind {kind!r} is missing field(s) {missing}")
    values = {k: fields[k][1](v, f"{where}: {kind}.{k}") for k, v in data.items() if k != "kind"}
    if kind in _ENUM_FIELD:
        attr, allowed = _ENUM_FIELD[kind]
        if values[attr] not in allowed:
            raise TpusimError(f"{where}: {attr} {_short(values[attr])} is not one of {', '.join(allowed)}")
    if values.get("family") and values["family"] not in _FAMILY_NAMES:
        raise TpusimError(f"{where}: family {_short(values['family'])} is not one of {', '.join(_FAMILY_NAMES)}")
    return cls(**values)


def _short(value: Any, limit: int = 60) -> str:
    """``repr`` of a value from a file, cut to ``limit`` characters (never echo a whole bad line)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


# What a record's numbers may be: a whole number fits in 64 bits (ids, bytes), and a count or a time (FLOPs,
# bytes moved, seconds: the float fields) lies in 0..1e24, as a chip file's numbers do; an op of 1e308 FLOPs was
# priced into "step time 0" beside "whole program 6.1e295 s" (issue 44, R38)
_WHOLE_LIMIT = 2**63
_COUNT_LIMIT = 1e24


def _check_int(value: Any, where: str) -> int:
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TpusimError(f"{where} must be a whole number, not {_short(value)}")
    if not -_WHOLE_LIMIT <= value < _WHOLE_LIMIT:
        raise TpusimError(f"{where} must be a whole number of 64 bits, not {_short(value)}")
    return value


def _check_float(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TpusimError(f"{where} must be a finite number, not {_short(value)}")
    if not 0 <= value <= _COUNT_LIMIT:
        raise TpusimError(f"{where} must be a number in 0..{_COUNT_LIMIT:g}, not {_short(value)}")
    return value


def _check_str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise TpusimError(f"{where} must be text, not {_short(value)}")
    return value


def _check_bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise TpusimError(f"{where} must be true or false, not {_short(value)}")
    return value


def _check_list(value: Any, where: str) -> list:
    if not isinstance(value, list | tuple):
        raise TpusimError(f"{where} must be a list, not {_short(value)}")
    return value


def _check_ints(value: Any, where: str) -> tuple[int, ...]:
    return tuple(_check_int(v, f"{where}[{i}]") for i, v in enumerate(_check_list(value, where)))


def _check_matmul(value: Any, where: str) -> tuple[int, int, int, int] | None:
    if value is None:
        return None
    dims = _check_ints(value, where)
    if len(dims) != 4:
        raise TpusimError(f"{where} must be [batch, m, k, n], not {_short(value)}")
    return dims  # type: ignore[return-value]


def _check_tensors(value: Any, where: str) -> tuple[TensorMeta, ...]:
    return tuple(_tensor_meta(t, f"{where}[{i}]") for i, t in enumerate(_check_list(value, where)))


# a record field's annotation (as written in the dataclass) -> the check that reads its JSON value
_CHECKS = {"int": _check_int, "float": _check_float, "str": _check_str, "bool": _check_bool,
           "tuple[int, ...]": _check_ints, "tuple[int, int, int, int] | None": _check_matmul,
           "tuple[TensorMeta, ...]": _check_tensors}
_FIELDS: dict[type, dict[str, tuple[bool, Any]]] = {}
_FAMILY_NAMES = tuple(str(f) for f in Family)


def _record_fields(cls: type) -> dict[str, tuple[bool, Any]]:
    """name -> (required, check) for a record class, built once per class from its annotations."""
    if cls not in _FIELDS:
        _FIELDS[cls] = {f.name: (f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
                                 _CHECKS[f.type if isinstance(f.type, str) else f.type.__name__])
                        for f in dataclasses.fields(cls)}
    return _FIELDS[cls]


def _tensor_meta(data: Any, where: str) -> TensorMeta:
    if not isinstance(data, dict):
        raise TpusimError(f"{where}: a tensor must be an object with id, shape, dtype, nbytes, storage, "
                          f"not {_short(data)}")
    try:
        return TensorMeta(id=_check_int(data["id"], f"{where}.id"), shape=_check_ints(data["shape"], f"{where}.shape"),
                          dtype=_check_str(data["dtype"], f"{where}.dtype"),
                          nbytes=_check_int(data["nbytes"], f"{where}.nbytes"),
                          storage=_check_int(data["storage"], f"{where}.storage"))
    except KeyError as missing:
        raise TpusimError(f"{where}: tensor is missing field {missing}; "
                          f"accepted: id, shape, dtype, nbytes, storage") from None


def write_trace(trace: Trace, path: str | Path) -> None:
    """Write JSON lines: header (with the record count, so a cut file is detected), then records; atomic
    (a unique temporary name, then one rename: tpusim/output.py)."""
    from tpusim.output import atomic_open

    header = {"schema": SCHEMA, "version": SCHEMA_VERSION, "world_size": trace.world_size,
              "rank": trace.rank, "records": len(trace.records), "meta": trace.meta.to_dict()}
    with atomic_open(path) as out:
        out.write(json.dumps(header, sort_keys=True) + "\n")
        for record in trace.records:
            out.write(json.dumps(record_to_dict(record), sort_keys=True) + "\n")


def read_trace(path: str | Path) -> Trace:
    """Read a program.jsonl; anything that is not a whole trace of a version this tpusim reads (not text,
    not JSON, another schema or version, a record of the wrong shape, a file cut short) is one TpusimError
    naming the file, the line and what is expected."""
    try:
        with open(path, encoding="utf-8") as handle:
            return _read_lines(str(path), handle)
    except UnicodeDecodeError:
        raise TpusimError(f"{path}: not a tpusim trace (not UTF-8 text)") from None
    except IsADirectoryError:
        raise TpusimError(f"{path}: is a folder, not a trace file") from None
    except OSError as error:
        raise TpusimError(f"{path}: cannot read: {error.strerror or error}") from None


READ_VERSIONS = (SCHEMA_VERSION,)   # trace versions this tpusim reads


def _read_lines(path: str, lines: Iterable[str]) -> Trace:
    lines = iter(lines)
    first = next(lines, "")
    if not first.strip():
        raise TpusimError(f"{path}: empty trace file")
    try:
        header = json.loads(first)
    except (ValueError, RecursionError):
        header = None
    if not isinstance(header, dict) or header.get("schema") != SCHEMA:
        raise TpusimError(f"{path}: not a tpusim trace (first line must be a JSON object with schema={SCHEMA!r})")
    version = header.get("version")
    if version not in READ_VERSIONS or isinstance(version, bool):
        older = isinstance(version, int) and not isinstance(version, bool) and version < min(READ_VERSIONS)
        raise TpusimError(f"{path}: trace schema version {_short(version)} is not supported; this tpusim reads "
                          f"version {', '.join(map(str, READ_VERSIONS))}"
                          + (" (the file is older: record it again with `tpusim run`)" if older else
                             " (the file is newer: update tpusim)" if isinstance(version, int) else ""))
    world_size = _check_int(header.get("world_size", 1), f"{path}: header world_size")
    rank = _check_int(header.get("rank", 0), f"{path}: header rank")
    if world_size < 1 or not 0 <= rank < world_size:
        raise TpusimError(f"{path}: header world_size {world_size} / rank {rank}: expected world_size >= 1 "
                          f"and 0 <= rank < world_size")
    expected = header.get("records")
    if expected is not None:
        expected = _check_int(expected, f"{path}: header records")
    records = []
    n = 1
    for n, line in enumerate(lines, start=2):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except (ValueError, RecursionError) as error:     # ValueError: bad JSON, or an int of 4300+ digits
            if not line.endswith("\n"):
                raise TpusimError(f"{path}:{n}: the file ends in the middle of a record (truncated: was the run "
                                  f"stopped while writing it?)") from None
            why = error.msg if isinstance(error, json.JSONDecodeError) else "nested too deeply or a number too long"
            raise TpusimError(f"{path}:{n}: not a JSON record ({why})") from None
        records.append(record_from_dict(data, f"{path}:{n}"))
    if expected is not None and len(records) != expected:
        raise TpusimError(f"{path}: the header says {expected} records but the file holds {len(records)} "
                          f"(truncated: was the run stopped while writing it?)")
    return Trace(records=tuple(records), world_size=world_size, rank=rank,
                 meta=TraceMeta.from_dict(header.get("meta", {}), f"{path}: meta"))


def renumber(records: Iterable[Record]) -> tuple[Record, ...]:
    """Give records consecutive ``seq`` numbers (after merging or filtering)."""
    return tuple(dataclasses.replace(r, seq=i) for i, r in enumerate(records))


# ---- trace meta: facts about the whole recording (the header's "meta") ----------------------------
#
# Written by the backend (recorder, compile, distributed) and by placement; read by lint, placement and
# the report. On disk the header's "meta" object holds one key per field that is set (None = absent), in
# the JSON form of its value, exactly as before the fields were typed, so old traces load and old readers
# read new ones. Adding a meta fact = one field here (optional, None by default) and its writer.


@dataclass(frozen=True)
class Mesh:
    """A DeviceMesh layout as the backend recorded it: dim names, shape, and the logical rank at each mesh
    index in row-major order (the last, innermost dim varies fastest). tpusim/placement maps its dims onto
    torus axes."""

    dim_names: tuple[str, ...]
    shape: tuple[int, ...]
    ranks: tuple[int, ...]

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class InexactCollective:
    """A ``--ranks one`` collective call site whose result follows the symmetry rule, not the reference."""

    kind: str                       # all_gather, all_reduce, ...
    source: str                     # the user's file:line
    count: int                      # calls at that line
    why: str                        # when the value would be exact anyway


@dataclass(frozen=True)
class RanksOne:
    """``--ranks one``: the numerics rule for collectives, and the calls whose values it made inexact."""

    rule: str
    not_reference_correct: tuple[InexactCollective, ...] = ()


@dataclass(frozen=True)
class GraphBreak:
    """A torch.compile graph break: Dynamo's reason and the user's line (built by backend/torch_compile/)."""

    reason: str
    source: str             # "file:line" of the user's code where Dynamo broke the graph


@dataclass(frozen=True)
class DynamoRecompile:
    """A function Dynamo traced again, and the guard that failed (built by backend/torch_compile/)."""

    function: str           # "name (file:line)"
    reason: str             # the guard that failed


@dataclass(frozen=True)
class EagerGraph:
    """A compiled graph that ran op by op because the JAX lowering lacks some of its ops."""

    graph: str
    missing: tuple[str, ...]


@dataclass(frozen=True)
class CompileFacts:
    """What torch.compile did in the program (tpusim/backend/torch_compile/jax_backend.py); tpusim/report/lint.py
    warns about it."""

    graphs: int = 0
    graph_breaks: tuple[GraphBreak, ...] = ()
    recompiles: tuple[DynamoRecompile, ...] = ()
    eager_graphs: tuple[EagerGraph, ...] = ()


@dataclass(frozen=True)
class MatmulPrecision:
    """The precision of f32 matmuls while recording (TorchTPU's ``torch.tpu.precision`` / ``Precision``, and
    ``allow_excess_precision``): how many bf16 passes of the MXU one f32 matmul takes."""

    precision: str               # "default", "high" or "highest" (StableHLO dot_general precision)
    bf16_passes: int             # 1 (default: operands rounded to bf16), 3 (high: bf16_3x), 6 (highest: bf16_6x)
    allow_excess_precision: bool = False   # XLA may keep bf16 intermediates in f32 (XLA_FLAGS / the property)


@dataclass(frozen=True)
class XlaModule:
    """One compiled graph as the TPU compiler would take it: its StableHLO, lowered for TPU, and the
    program executions (``OpRecord.program`` numbers) that ran it; ``error`` says why there is no text."""

    label: str                      # "graph 0 (forward)"
    stablehlo: str = ""
    programs: tuple[int, ...] = ()
    error: str = ""
    devices: int = 1                # devices the program spans: a graph with collectives, lowered whole, over its group
    segments: int = 1               # program executions one run stands for: its segments, consecutive from each number


def rank_records(trace: Trace) -> dict[int, tuple[Record, ...]]:
    """The records of each recorded rank; a trace of one rank is the program every rank runs."""
    ranks = sorted({r.rank for r in trace.records}) or [trace.rank]
    if len(ranks) == 1:
        return {ranks[0]: tuple(trace.records)}
    return {rank: tuple(r for r in trace.records if r.rank == rank) for rank in ranks}


def op_signature(op: str, inputs: Iterable[tuple[tuple[int, ...], str]],
                 outputs: Iterable[tuple[tuple[int, ...], str]]) -> str:
    """An eager op's signature as the TPU compiler's programs are keyed (``TraceMeta.xla_ops``): its name and
    its tensors' shapes and dtypes, e.g. 'aten::mm|bfloat16[64,128],bfloat16[128,256]->bfloat16[64,256]'."""
    def spell(tensors: Iterable[tuple[tuple[int, ...], str]]) -> str:
        return ",".join(f"{dtype}[{','.join(map(str, shape))}]" for shape, dtype in tensors)

    return f"{op}|{spell(inputs)}->{spell(outputs)}"


def record_signature(record: OpRecord) -> str:
    """``op_signature`` of a recorded op."""
    return op_signature(record.op, ((t.shape, t.dtype) for t in record.inputs),
                        ((t.shape, t.dtype) for t in record.outputs))


RANKS = ("one", "all")


@dataclass(frozen=True)
class TraceMeta:
    """Facts about a whole recording that no single record carries. Every field is optional: None means
    the recording did not say (the key is absent on disk)."""

    device: str | None = None               # "tpu"
    chip: str | None = None                 # the chip the device simulated while recording (TPUSIM_CHIP)
    devices: int | None = None              # tpu devices in the recording process
    hbm_bytes: int | None = None            # HBM capacity per device (0 = unlimited)
    numerics: bool | None = None            # False: shape-only recording (--numerics off)
    eager_mode: str | None = None           # the eager mode the recording started in
    f64_ops: tuple[str, ...] | None = None  # ops that ran in float64/complex (on the host)
    torch_compile: CompileFacts | None = None   # only when the program used torch.compile
    inference_mode_compiles: tuple[str, ...] | None = None   # lines that ran a compiled graph under inference_mode
    meshes: tuple[Mesh, ...] | None = None  # every root DeviceMesh on "tpu", in creation order
    ranks: str | None = None                # "one" (rank 0 priced by symmetry) or "all" (every rank ran)
    ranks_recorded: tuple[int, ...] | None = None   # --ranks all: the ranks whose traces were merged
    ranks_one: RanksOne | None = None       # --ranks one: the numerics rule, once a collective used it
    placement: str | None = None            # --placement the collective groups were remapped by: "tp=x,fsdp=yz"
    matmul_precision: MatmulPrecision | None = None   # f32 matmul precision (torch.tpu.precision); the highest used
    xla_modules: tuple[XlaModule, ...] | None = None  # torch.compile graphs' StableHLO, for the TPU compiler
    xla_ops: tuple[XlaModule, ...] | None = None      # each distinct eager op's (label: its op_signature)
    trained_parameters: int | None = None   # parameters an optimizer step updated on tpu (a DTensor: its global
                                            # size), for model FLOPs (6 x parameters x tokens)
    host_peak_bytes: int | None = None      # peak host memory held by offloaded tensors (backend/dispatch/offload.py);
                                            # only when the program offloaded

    def __post_init__(self) -> None:
        if self.ranks is not None and self.ranks not in RANKS:
            raise TpusimError(f"trace meta: ranks {self.ranks!r} is not one of {', '.join(RANKS)}")

    def replace(self, **changes: Any) -> TraceMeta:
        """This meta with ``changes``; an unknown name is an error that lists the accepted ones."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise TpusimError(f"trace meta: unknown key(s) {unknown}; accepted: {', '.join(_META_KEYS)}")
        return dataclasses.replace(self, **changes)

    def set_fields(self) -> dict[str, Any]:
        """The fields that are set (not None), as typed values."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}

    def to_dict(self) -> dict[str, Any]:
        """The header's JSON form: one key per field that is set."""
        return {name: _to_json(value) for name, value in self.set_fields().items()}

    @classmethod
    def from_dict(cls, data: Any, where: str = "trace meta") -> TraceMeta:
        """The header's JSON form -> TraceMeta; an unknown key or a value of the wrong shape is a
        TpusimError naming the key and what is accepted."""
        return _from_json(data, cls, where)


_META_KEYS = tuple(f.name for f in dataclasses.fields(TraceMeta))


def _to_json(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return {f.name: _to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        return [_to_json(v) for v in value]
    return value


def _from_json(value: Any, kind: Any, where: str) -> Any:
    """``value`` (parsed JSON) as an instance of the annotated type ``kind``, checked on the way."""
    if isinstance(kind, types.UnionType):                       # X | None
        if value is None:
            return None
        (kind,) = [k for k in typing.get_args(kind) if k is not type(None)]
    if typing.get_origin(kind) is tuple:                        # tuple[X, ...]
        if not isinstance(value, list | tuple):
            raise TpusimError(f"{where} must be a list, not {value!r}")
        item = typing.get_args(kind)[0]
        return tuple(_from_json(v, item, f"{where}[{i}]") for i, v in enumerate(value))
    if dataclasses.is_dataclass(kind):
        if not isinstance(value, dict):
            raise TpusimError(f"{where} must be an object with keys "
                              f"{', '.join(f.name for f in dataclasses.fields(kind))}, not {value!r}")
        hints = typing.get_type_hints(kind)
        fields = {f.name: f for f in dataclasses.fields(kind)}
        unknown = sorted(set(value) - set(fields))
        if unknown:
            raise TpusimError(f"{where}: unknown key(s) {unknown}; accepted: {', '.join(fields)}")
        missing = [name for name, f in fields.items() if name not in value
                   and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        if missing:
            raise TpusimError(f"{where}: missing key(s) {missing}")
        return kind(**{name: _from_json(v, hints[name], f"{where}.{name}") for name, v in value.items()})
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise TpusimError(f"{where} must be a whole number, not {value!r}")
    if kind in (str, bool) and not isinstance(value, kind):
        raise TpusimError(f"{where} must be {'a string' if kind is str else 'true or false'}, not {value!r}")
    return value
