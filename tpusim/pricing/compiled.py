"""What the TPU compiler built for a trace, asked once and handed to pricing as one value.

Why here: ``tpusim run``, ``tpusim compare`` and ``tpusim sweep`` must price a recording the same way, so
they ask the compiler through this one door (``ask_compiler``: the ``--compiler`` choice, turned into what
XLA built or why it built nothing) and pass ``compiler_output`` of the answer to ``tpusim.pricing.price``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from tpusim.eager.compiled import MODEL_ONLY, CompilerOutput
from tpusim.errors import TpusimError
from tpusim.hardware.spec import ChipSpec
from tpusim.trace.records import OpRecord, Trace

if TYPE_CHECKING:
    from tpusim.xla.programs import XlaEstimates


def check_compiler(choice: str, where: str = "--compiler") -> None:
    """A ``--compiler`` value refused before anything runs: an unknown one, or xla without the extra."""
    from tpusim.xla.compiler import missing
    from tpusim.xla.programs import COMPILERS

    if choice not in COMPILERS:
        raise TpusimError(f"{where} {choice!r}; accepted: {', '.join(COMPILERS)}")
    why = missing() if choice == "xla" else None
    if why:                                  # asked for by name: say so before the script runs
        raise TpusimError(f"{where} xla: {why}")


def ask_compiler(trace: Trace, chip: ChipSpec, compiler: str,
                 say: Callable[[str], None] | None = None) -> XlaEstimates | None:
    """What the TPU compiler built for the trace's programs, or why it built nothing (None: nothing it would
    build, or --compiler model for an eager-only run)."""
    from tpusim.xla.programs import XlaEstimates, auto_declined, estimate_programs, use_compiler

    modules = trace.meta.xla_modules or ()
    if use_compiler(compiler):
        return estimate_programs(trace, chip, say) if modules or trace.meta.xla_ops else None
    if compiler == "model":
        return XlaEstimates(fell_back=tuple(f"{m.label}: --compiler model" for m in modules)) if modules else None
    if not modules and not any(isinstance(r, OpRecord) for r in trace.records):
        return None                          # nothing the compiler would have built
    why = auto_declined()                    # auto without the compiler: one line says why
    return XlaEstimates(fell_back=tuple(f"{label}: {why}" for label in [m.label for m in modules] or ["eager ops"]))


def compiler_output(xla: XlaEstimates | None) -> CompilerOutput:
    """The kernels XLA built (for programs, eager ops and Fused clusters) as the one value pricing takes."""
    if xla is None:
        return MODEL_ONLY
    return CompilerOutput(programs=xla.kernels(), ops=xla.op_kernels(), clusters=xla.cluster_kernels())
