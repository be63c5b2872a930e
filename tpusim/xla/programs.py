"""A trace's torch.compile graphs through the TPU compiler: XLA's own estimate per program, or why not.

Each distinct graph (``TraceMeta.xla_modules``) is compiled once for one device of the run's chip. What
XLA built prices the program: its fusions become the kernels tpusim's engine runs (``tpusim.xla.kernels``,
``XlaEstimates.kernels``), and XLA's estimated cycles of one execution (every fusion, loops counted) over
the chip's clock is XLA's own estimate, set beside tpusim's in the report (``tpusim.report.xla``).
Programs over several devices (a graph with collectives) are not compiled yet: they fall back, said so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tpusim.eager.fusion import FusedKernel
from tpusim.hardware.spec import ChipSpec
from tpusim.trace.records import Trace
from tpusim.xla.compiler import XlaUnavailable, compile_stablehlo, missing, target_for
from tpusim.xla.hlo import parse_program
from tpusim.xla.kernels import program_kernels

COMPILERS = ("auto", "xla", "model")   # --compiler: auto = xla where the extra is installed


@dataclass(frozen=True)
class ProgramEstimate:
    """XLA's view of one compiled graph, per execution."""

    label: str
    programs: tuple[int, ...]          # the executions (OpRecord.program numbers)
    fusions: int                       # distinct fusions XLA built
    estimated_s: float                 # XLA's estimated cycles over the chip's clock
    hbm_peak_bytes: int                # the compiled executable's peak memory
    compile_s: float
    cached: bool
    built: tuple[FusedKernel, ...] = ()   # the kernels one execution launches (loops counted), for pricing

    @property
    def kernels(self) -> int:
        """XLA's kernels launched per execution (loops counted)."""
        return len(self.built)


@dataclass(frozen=True)
class XlaEstimates:
    """What the TPU compiler said about a trace's compiled graphs, and which fell back to the model."""

    compiled: tuple[ProgramEstimate, ...] = ()
    fell_back: tuple[str, ...] = ()    # "graph 2 (backward): <why>"

    @property
    def priced(self) -> bool:
        return bool(self.compiled)

    def kernels(self) -> dict[int, tuple[FusedKernel, ...]]:
        """Each compiled program execution (``OpRecord.program``) -> the kernels XLA built for it."""
        return {n: p.built for p in self.compiled for n in p.programs}


def use_compiler(choice: str) -> bool:
    """Whether ``--compiler`` asks for XLA here: xla always (a missing extra is then an error), auto where
    the extra is installed, model never."""
    if choice == "model":
        return False
    return choice == "xla" or missing() is None


def estimate_programs(trace: Trace, chip: ChipSpec,
                      progress: Callable[[str], None] | None = None) -> XlaEstimates:
    """Compile each of the trace's graphs for ``chip`` (cached) and read XLA's estimate of it."""
    modules = trace.meta.xla_modules or ()
    try:
        target = target_for(chip)
    except XlaUnavailable as why:           # the chip itself: every graph falls back for the same reason
        return XlaEstimates(fell_back=tuple(f"{module.label}: {why}" for module in modules))
    compiled, fell_back = [], []
    for module in modules:
        try:
            if module.error:
                raise XlaUnavailable(module.error)
            if progress:
                progress(f"TPU compiler: {module.label}")
            result = compile_stablehlo(module.stablehlo, target)
            program = parse_program(result.hlo)
            compiled.append(ProgramEstimate(module.label, module.programs, len(program.fusions),
                                            program.estimated_cycles / target.clock_hz,
                                            result.memory.get("peak_memory_in_bytes", 0), result.compile_s,
                                            result.cached, program_kernels(program)))
        except XlaUnavailable as why:
            fell_back.append(f"{module.label}: {why}")
    return XlaEstimates(tuple(compiled), tuple(fell_back))
