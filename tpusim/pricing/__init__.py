"""Record once, price many: one trace priced per eager mode, chip and topology by replay.

    from tpusim.eager.modes import get_mode
    from tpusim.pricing import price
    from tpusim.slice.topology import build_slice
    timeline = price(trace, topology=build_slice("3d:8x8x8", chip="v5p"), mode=get_mode("fused"))

``price`` = the mode's plan of the trace (``tpusim.pricing.planning.plan``: checks, fusion, compiles),
then the simulation of that plan (``tpusim.pricing.engine.simulate``). It takes typed values only: the slice,
the ``EagerMode`` and what the TPU compiler built (``CompilerOutput``, from ``tpusim.pricing.compiled``); names
("fused", "2d:4x4", --compiler) become those at the edges (the command line, ``RunOptions``, a sweep's points,
validate's cases). Modes are ``tpusim.eager.modes``' registry; adding one = one row there.
"""

from __future__ import annotations

from collections.abc import Callable

from tpusim.eager.compiled import MODEL_ONLY, CompilerOutput
from tpusim.eager.modes import DEFAULT_MODE, EagerMode, get_mode
from tpusim.errors import TpusimError
from tpusim.hardware.compute import at_matmul_precision
from tpusim.hardware.spec import ChipSpec
from tpusim.pricing.engine import simulate
from tpusim.pricing.planning import plan
from tpusim.pricing.timeline import Timeline
from tpusim.slice.topology import Slice
from tpusim.trace.records import Trace

__all__ = ["CompilerOutput", "MODEL_ONLY", "price", "single_chip_topology"]

DEFAULT: EagerMode = get_mode(DEFAULT_MODE)    # the mode priced when none is given


def single_chip_topology(chip: ChipSpec) -> str:
    """The default slice of `tpusim run`: one chip of the chosen generation."""
    return f"{chip.torus_dims}d:" + "x".join("1" * chip.torus_dims)


def priced_chip(chip: ChipSpec, trace: Trace) -> ChipSpec:
    """``chip`` as the trace's kernels are priced on it: float32 matmuls at the precision the program ran at."""
    precision = trace.meta.matmul_precision
    return at_matmul_precision(chip, precision.bf16_passes if precision else 1)


def price(trace: Trace, *, topology: Slice, mode: EagerMode = DEFAULT,
          compiled: CompilerOutput = MODEL_ONLY, chunk_bytes: int | None = None,
          progress: Callable[[str], None] | None = None) -> Timeline:
    """Simulate ``trace`` on the slice ``topology`` under one eager mode and return its Timeline; ``compiled``:
    what the TPU compiler built (program executions, eager ops, Fused eager clusters), priced in its place.
    Float32 matmuls cost the bf16 passes of the precision the program ran at (TorchTPU's DEFAULT, one pass,
    unless it asked for more: ``TraceMeta.matmul_precision``)."""
    if not isinstance(topology, Slice):
        raise TpusimError(f"price() takes the slice as a Slice (tpusim.slice.topology.build_slice({topology!r}, "
                          f"chip=...)), not {type(topology).__name__} {topology!r}")
    if not isinstance(mode, EagerMode):
        raise TpusimError(f"price() takes an EagerMode (tpusim.eager.modes.get_mode({mode!r})), not "
                          f"{type(mode).__name__} {mode!r}")
    if not isinstance(compiled, CompilerOutput):
        raise TpusimError(f"price() takes what the compiler built as a CompilerOutput "
                          f"(tpusim.pricing.compiled.compiler_output), not {type(compiled).__name__}")
    if progress:
        progress(f"pricing {mode.name} mode on {topology.spec} ({topology.chip.name})")
    return simulate(plan(trace, mode, priced_chip(topology.chip, trace), compiled), topology, chunk_bytes=chunk_bytes)
