"""Record once, price many: one trace priced per eager mode, chip and topology by replay.

    from tpusim.pricing import price
    timeline = price(trace, topology="3d:8x8x8", mode="fused")

``price`` = the mode's plan of the trace (``tpusim.pricing.planning.plan``: checks, fusion, compiles),
then the simulation of that plan (``tpusim.pricing.engine.simulate``). Modes are ``tpusim.eager.modes``' registry;
adding one = one row there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from tpusim.eager.fusion import ClusterCall, CompiledProgram
from tpusim.eager.modes import DEFAULT_MODE, get_mode
from tpusim.hardware.compute import at_matmul_precision
from tpusim.hardware.spec import ChipSpec
from tpusim.pricing.engine import simulate
from tpusim.pricing.planning import plan
from tpusim.pricing.timeline import Timeline
from tpusim.slice.topology import Slice, build_slice
from tpusim.trace.records import Trace

__all__ = ["price", "single_chip_topology"]


def single_chip_topology(chip: ChipSpec) -> str:
    """The default slice of `tpusim run`: one chip of the chosen generation."""
    return f"{chip.torus_dims}d:" + "x".join("1" * chip.torus_dims)


def priced_chip(chip: ChipSpec, trace: Trace) -> ChipSpec:
    """``chip`` as the trace's kernels are priced on it: float32 matmuls at the precision the program ran at."""
    precision = trace.meta.matmul_precision
    return at_matmul_precision(chip, precision.bf16_passes if precision else 1)


def price(trace: Trace, *, topology: str | Slice = "", chip: str | ChipSpec | None = None,
          mode: str = DEFAULT_MODE, chunk_bytes: int | None = None,
          progress: Callable[[str], None] | None = None,
          compiled: Mapping[int, CompiledProgram] | None = None,
          compiled_ops: Mapping[str, CompiledProgram] | None = None,
          compiled_clusters: Mapping[ClusterCall, CompiledProgram] | None = None) -> Timeline:
    """Simulate ``trace`` on a slice under one eager mode and return its Timeline; ``compiled``: the kernels
    the TPU compiler built for program executions (``tpusim.xla.programs``), ``compiled_ops`` for eager ops
    (by ``tpusim.trace.records.record_signature``) and ``compiled_clusters`` for Fused eager clusters, priced in
    their place. Float32 matmuls cost the bf16 passes of the precision the program ran at (TorchTPU's
    DEFAULT, one pass, unless it asked for more: ``TraceMeta.matmul_precision``)."""
    slice_ = topology if isinstance(topology, Slice) else build_slice(topology or "3d:1x1x1", chip=chip)
    kernel_chip = priced_chip(slice_.chip, trace)
    eager_mode = get_mode(mode)  # an unknown name raises with the accepted ones
    if progress:
        progress(f"pricing {eager_mode.name} mode on {slice_.spec} ({slice_.chip.name})")
    return simulate(plan(trace, eager_mode, kernel_chip, compiled, compiled_ops, compiled_clusters), slice_,
                    chunk_bytes=chunk_bytes)
