"""Collective records into the active recording (backend/recorder.py), and the DeviceMesh layouts.

The recorder has no public collective hook yet, so this module appends ``CollectiveRecord``s under
the recording's lock with the recorder's own tensor-id function (``recorder._metas``): the same ids
the op records use, so ops reading a collective's output wait for it in the simulator.

DeviceMesh layouts (dim names, shape, the ranks in row-major order) go into ``trace.meta["meshes"]``
so tpusim/placement.py can map mesh dimensions onto torus axes without torch.
"""

from __future__ import annotations

import torch
from tpusim.backend import recorder
from tpusim.backend.source import user_source

from tpusim.trace import CollectiveRecord

MESHES: list[dict] = []


def note_mesh(dim_names: tuple[str, ...] | None, ranks: list, shape: tuple[int, ...]) -> None:
    """Remember one DeviceMesh layout (deduplicated); written to every later recording's meta."""
    names = [str(n) for n in (dim_names or [f"dim{i}" for i in range(len(shape))])]
    entry = {"dim_names": names, "shape": [int(s) for s in shape], "ranks": [int(r) for r in ranks]}
    if entry not in MESHES:
        MESHES.append(entry)
    _sync_meta()


def _sync_meta() -> None:
    rec = recorder._ACTIVE
    if rec is not None and MESHES:
        rec.meta["meshes"] = [dict(m) for m in MESHES]


def set_meta(key: str, value: object) -> None:
    """Put ``key`` into the active recording's trace meta (no-op when nothing records)."""
    rec = recorder._ACTIVE
    if rec is not None:
        rec.meta[key] = value


def recording() -> bool:
    return recorder._ACTIVE is not None


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype)[6:]


def collective(kind: str, inputs: list[torch.Tensor], outputs: list[torch.Tensor], group: tuple[int, ...],
               *, mesh_axis: str = "", reduce_op: str = "", async_op: bool = False,
               nbytes: int | None = None, source: str | None = None) -> None:
    """Append one CollectiveRecord: ``bytes`` = this rank's input bytes unless ``nbytes`` is given."""
    rec = recorder._ACTIVE
    if rec is None:
        return
    size = nbytes if nbytes is not None else sum(t.numel() * t.element_size() for t in inputs)
    dtype = _dtype((inputs or outputs)[0]) if (inputs or outputs) else "float32"
    where = user_source() if source is None else source
    with rec.lock:
        recorder._drain_memory(rec)
        ins = recorder._metas(rec, [t for t in inputs if t.device.type == "tpu"])
        outs = recorder._metas(rec, [t for t in outputs if t.device.type == "tpu"])
        rec.records.append(CollectiveRecord(0, kind, int(size), tuple(group), ins, outs, mesh_axis, reduce_op,
                                            dtype, async_op, where))
    _sync_meta()
