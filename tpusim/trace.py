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
                  simulator prices them as one XLA program (tpusim/fusion.py), not as
                  eager ops; 0 (the default, and absent in older traces) is eager.
                  ``family`` is the op's family (tpusim/ops.py), recorded so the simulator
                  never works it out again from the name (older traces: derived from ``op``).
- ``collective``  all_reduce / all_gather / ... : bytes per rank, the process group
                  as ranks and/or a mesh axis name, the reduction, async or not.
- ``host``        host work the device must wait for or that waits for the device:
                  ``sync`` (``.item()``, ``.cpu()``, ``print``, ``synchronize``),
                  ``h2d`` and ``d2h`` copies, explicit ``dispatch`` time.
- ``memory``      ``alloc`` / ``free`` of device storage: the HBM live-bytes timeline.
- ``step``        a training-step boundary (``optimizer.step`` or ``tpusim.step()``).

Example (two lines of a trace file)::

    {"schema": "tpusim-trace", "version": 1, "world_size": 1, "rank": 0, "meta": {}}
    {"kind": "op", "seq": 0, "op": "aten::mm", "unit": "mxu", "dtype": "bfloat16",
     "inputs": [{"id": 1, "shape": [64, 128], "dtype": "bfloat16", "nbytes": 16384, "storage": 1}, ...],
     "outputs": [...], "flops": 2097152, "transcendentals": 0, "bytes_read": 49152,
     "bytes_written": 32768, "matmul": [1, 64, 128, 128], "source": "model.py:12"}

Adding a record kind = one dataclass with a ``kind`` class variable, listed in ``RECORD_TYPES``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from tpusim.errors import TpusimError
from tpusim.ops import family_of

SCHEMA = "tpusim-trace"
SCHEMA_VERSION = 1

UNITS = ("mxu", "vpu", "sparsecore", "dma")
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce",
               "permute", "barrier")
HOST_EVENTS = ("sync", "h2d", "d2h", "dispatch")
MODE_CHANGE_REASON = "eager_mode:"  # + the new mode: reason of the dispatch record marking a change of eager mode
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
    family: str = ""                # tpusim.ops.Family, recorded by the backend; "" (older traces): from ``op``

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
    """A recorded program: who recorded it and the records in issue order."""

    records: tuple[Record, ...]
    world_size: int = 1
    rank: int = 0
    meta: dict[str, Any] = field(default_factory=dict)

    def of_kind(self, cls: type) -> list:
        return [r for r in self.records if isinstance(r, cls)]


def record_to_dict(record: Record) -> dict[str, Any]:
    return {"kind": record.kind, **dataclasses.asdict(record)}


def record_from_dict(data: dict[str, Any], where: str = "record") -> Record:
    """Build a record from its JSON form, naming the field and accepted values on error."""
    kind = data.get("kind")
    if kind not in RECORD_TYPES:
        raise TpusimError(f"{where}: unknown kind {kind!r}; accepted: {', '.join(RECORD_TYPES)}")
    cls = RECORD_TYPES[kind]
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(data) - set(fields) - {"kind"}
    if unknown:
        raise TpusimError(f"{where}: unknown field(s) {sorted(unknown)} for kind {kind!r}; "
                          f"accepted: {', '.join(fields)}")
    missing = [name for name, f in fields.items() if name not in data
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise TpusimError(f"{where}: kind {kind!r} is missing field(s) {missing}")
    values = {k: v for k, v in data.items() if k != "kind"}
    for key in ("inputs", "outputs"):
        if key in values:
            values[key] = tuple(_tensor_meta(t, f"{where}.{key}") for t in values[key])
    for key in ("group", "matmul"):
        if values.get(key) is not None:
            values[key] = tuple(values[key])
    if kind in _ENUM_FIELD:
        attr, allowed = _ENUM_FIELD[kind]
        if values[attr] not in allowed:
            raise TpusimError(f"{where}: {attr} {values[attr]!r} is not one of {', '.join(allowed)}")
    return cls(**values)


def _tensor_meta(data: dict[str, Any], where: str) -> TensorMeta:
    try:
        return TensorMeta(id=data["id"], shape=tuple(data["shape"]), dtype=data["dtype"],
                          nbytes=data["nbytes"], storage=data["storage"])
    except KeyError as missing:
        raise TpusimError(f"{where}: tensor is missing field {missing}; "
                          f"accepted: id, shape, dtype, nbytes, storage") from None


def write_trace(trace: Trace, path: str | Path) -> None:
    """Write JSON lines: header, then records; atomic (temp file + rename)."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    header = {"schema": SCHEMA, "version": SCHEMA_VERSION, "world_size": trace.world_size,
              "rank": trace.rank, "meta": trace.meta}
    with tmp.open("w") as out:
        out.write(json.dumps(header, sort_keys=True) + "\n")
        for record in trace.records:
            out.write(json.dumps(record_to_dict(record), sort_keys=True) + "\n")
    tmp.replace(path)


def read_trace(path: str | Path) -> Trace:
    lines = Path(path).read_text().splitlines()
    if not lines:
        raise TpusimError(f"{path}: empty trace file")
    header = json.loads(lines[0])
    if header.get("schema") != SCHEMA:
        raise TpusimError(f"{path}: not a tpusim trace (first line must have schema={SCHEMA!r})")
    if header.get("version") != SCHEMA_VERSION:
        raise TpusimError(f"{path}: trace schema version {header.get('version')!r} is not supported; "
                          f"this tpusim reads version {SCHEMA_VERSION}")
    records = tuple(record_from_dict(json.loads(line), f"{path}:{n}")
                    for n, line in enumerate(lines[1:], start=2) if line.strip())
    return Trace(records=records, world_size=header.get("world_size", 1), rank=header.get("rank", 0),
                 meta=header.get("meta", {}))


def renumber(records: Iterable[Record]) -> tuple[Record, ...]:
    """Give records consecutive ``seq`` numbers (after merging or filtering)."""
    return tuple(dataclasses.replace(r, seq=i) for i, r in enumerate(records))
