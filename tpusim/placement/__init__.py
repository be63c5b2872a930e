"""Placement: which torus axes each DeviceMesh dimension runs on, and what that does to step time.

A DeviceMesh lays ranks out row-major (the last, innermost dim varies fastest); the slice numbers
chips x-fastest. A placement maps each mesh dim to *segments* of torus axes: ``(axis, size,
stride)`` = ``size`` chips along ``axis``, ``stride`` apart in that axis' coordinate. The trace is
recorded once with logical ranks; ``remap`` rewrites every collective's group (and, for a
multi-rank trace, every record's rank) to the physical ranks under a placement, so the engine
prices the collectives on the mapped axes. Nothing here imports torch.

**Default mapping**: mesh dims from the innermost (usually tensor parallel) outwards take torus
axes in the order x, y, z, consecutive chips first. So a (fsdp=64, tp=8) mesh on 3d:8x8x8 puts tp
on x (one axis of 8, wrapped when the slice is whole cubes) and fsdp on the y-z plane; this is
exactly the identity rank -> ``Slice.coord_of(rank)``.

**Syntax** (``--placement``): ``dim=AXES`` pairs, comma separated; AXES is axis letters, each
optionally followed by how many of its chips the dim takes: ``tp=x,fsdp=yz``, ``tp=y,fsdp=xz``,
``tp=x4,fsdp=x2yz`` (tp on 4 consecutive chips of x; fsdp on the other factor 2 of x, then y, z).
Without a count a dim takes what it still needs from that axis, or the whole axis.

**Compare** (``--compare-placements``): every distinct placement (up to torus symmetry: axes of
equal length and wraparound are interchangeable), priced and ranked by step time, with the reason
the best one wins: the mesh dim whose collectives gained most, on how many axes, wrapped or not.

One module per job, each returning dataclasses (dicts only where report.json is written,
tpusim/report/model.py):

- ``mesh``         the model: ``Mesh`` (as recorded), ``MeshSegment``, ``Placement``, the default mapping
- ``parse``        ``--placement`` text -> ``Placement``
- ``search``       every distinct placement up to torus symmetry
- ``remap``        a placement applied to a trace (and undone)
- ``compare``      each placement priced, ranked, and why the best wins -> ``PlacementComparison``
- ``distributed``  the report's view of --ranks and the placement in effect -> ``Distributed``
- ``text``         the words: segment descriptions and the terminal lines after the summary
"""

from tpusim.placement.compare import PlacementComparison, PricedPlacement, compare, price_placement, why_best
from tpusim.placement.distributed import Distributed, distributed_info
from tpusim.placement.mesh import Mesh, MeshSegment, Placement, default_placement, trace_mesh
from tpusim.placement.parse import parse_placement
from tpusim.placement.remap import apply_placement, logical, remap
from tpusim.placement.search import MAX_PLACEMENTS, enumerate_placements
from tpusim.placement.text import describe_segments

__all__ = ["MAX_PLACEMENTS", "Distributed", "Mesh", "MeshSegment", "Placement", "PlacementComparison",
           "PricedPlacement", "apply_placement", "compare", "default_placement", "describe_segments",
           "distributed_info", "enumerate_placements", "logical", "parse_placement", "price_placement", "remap",
           "trace_mesh", "why_best"]
