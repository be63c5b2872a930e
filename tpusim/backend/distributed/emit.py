"""Collective records into the active recording (``recorder.record_collective``), and the DeviceMesh layouts.

The recorder gives collectives the same tensor ids as op records, so ops reading a collective's
output wait for it in the simulator.

DeviceMesh layouts (dim names, shape, the ranks in row-major order) go into ``trace.meta.meshes``
(``tpusim.trace.records.Mesh``) so tpusim/placement can map mesh dimensions onto torus axes without torch.
"""

from __future__ import annotations

import torch

from tpusim.backend.plumbing.source import user_source
from tpusim.backend.plumbing.state import STATE
from tpusim.backend.program_trace import recorder
from tpusim.trace.records import Mesh

MESHES: list[dict] = []


def note_mesh(dim_names: tuple[str, ...] | None, ranks: list, shape: tuple[int, ...]) -> None:
    """Remember one DeviceMesh layout (deduplicated); written to every later recording's meta."""
    names = [str(n) for n in (dim_names or [f"dim{i}" for i in range(len(shape))])]
    entry = {"dim_names": names, "shape": [int(s) for s in shape], "ranks": [int(r) for r in ranks]}
    if entry not in MESHES:
        MESHES.append(entry)
    _sync_meta()


def _sync_meta() -> None:
    if MESHES and STATE.recording:
        recorder.set_meta("meshes", tuple(Mesh(tuple(m["dim_names"]), tuple(m["shape"]), tuple(m["ranks"]))
                                          for m in MESHES))


def set_meta(key: str, value: object) -> None:
    """Set field ``key`` of the active recording's ``TraceMeta`` (no-op when nothing records)."""
    recorder.set_meta(key, value)


def recording() -> bool:
    return STATE.recording


def collective(kind: str, inputs: list[torch.Tensor], outputs: list[torch.Tensor], group: tuple[int, ...],
               *, mesh_axis: str = "", reduce_op: str = "", async_op: bool = False,
               nbytes: int | None = None, source: str | None = None) -> None:
    """Record one collective: ``bytes`` = this rank's input bytes unless ``nbytes`` is given."""
    if not STATE.recording:
        return
    size = nbytes if nbytes is not None else sum(t.numel() * t.element_size() for t in inputs)
    tensors = inputs or outputs
    dtype = str(tensors[0].dtype)[6:] if tensors else "float32"
    recorder.record_collective(kind, size, tuple(group), inputs, outputs, mesh_axis, reduce_op, dtype, async_op,
                               user_source() if source is None else source)
    _sync_meta()
