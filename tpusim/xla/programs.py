"""A trace's programs through the TPU compiler: what XLA built for each, or why the model prices it.

Three kinds of program, each compiled once per distinct text (cached on disk, ``tpusim.xla.compiler``):

- **torch.compile graphs** (``TraceMeta.xla_modules``), for one device of the run's chip; a graph with
  collectives first whole, over its group's devices, and segment by segment only where that fails;
- **eager ops** (``TraceMeta.xla_ops``): each distinct op's one-op program, run in Strict and Debug;
- **Fused eager clusters**: each distinct cluster's program, composed from its ops' (``tpusim.xla.clusters``).

What XLA built prices the program: its fusions and collectives become the records tpusim's engine runs
(``tpusim.xla.kernels``), and XLA's estimated cycles over the chip's clock is XLA's own estimate, set
beside tpusim's in the report (``tpusim.report.xla``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tpusim.eager.fusion import ClusterCall, CompiledProgram, FusedKernel, fuse
from tpusim.hardware.spec import ChipSpec
from tpusim.trace.records import Trace, rank_records
from tpusim.xla.clusters import compose
from tpusim.xla.compiler import (
    Compiled,
    XlaTarget,
    XlaUnavailable,
    compile_many,
    compile_stablehlo,
    missing,
    target_for,
)
from tpusim.xla.hlo import XlaProgram, parse_program
from tpusim.xla.kernels import program_records

COMPILERS = ("auto", "xla", "model")   # --compiler: auto = xla where the extra is installed


@dataclass(frozen=True)
class ProgramEstimate:
    """XLA's view of one compiled graph, per execution."""

    label: str
    programs: tuple[int, ...]          # the executions (OpRecord.program numbers; a whole graph's first segment's)
    fusions: int                       # distinct fusions XLA built
    estimated_s: float                 # XLA's estimated cycles over the chip's clock
    hbm_peak_bytes: int                # the compiled executable's peak memory
    compile_s: float
    cached: bool
    built: CompiledProgram = CompiledProgram(())   # one execution in XLA's schedule, for pricing
    devices: int = 1                   # devices the program spans (a graph with collectives: its group)

    @property
    def kernels(self) -> int:
        """XLA's kernels launched per execution (loops counted)."""
        return sum(1 for r in self.built.records if isinstance(r, FusedKernel))

    @property
    def executions(self) -> tuple[int, ...]:
        """Every program execution it stands for (a whole graph: each run's segments)."""
        return tuple(n + i for n in self.programs for i in range(self.built.spans))


@dataclass(frozen=True)
class OpEstimate:
    """XLA's one-op program for an eager op signature (Strict and Debug run each op as its own executable)."""

    estimated_s: float                 # XLA's estimated cycles over the chip's clock, per call
    built: CompiledProgram


@dataclass(frozen=True)
class XlaEstimates:
    """What the TPU compiler built for a trace's graphs, eager ops and Fused clusters, and what fell back."""

    compiled: tuple[ProgramEstimate, ...] = ()
    fell_back: tuple[str, ...] = ()    # "graph 2 (backward): <why>"
    ops: dict[str, OpEstimate] = field(default_factory=dict)   # eager op signature -> its one-op program
    ops_fell_back: dict[str, str] = field(default_factory=dict)   # eager op signature -> why the model prices it
    clusters: dict[ClusterCall, OpEstimate] = field(default_factory=dict)   # a Fused cluster -> its program
    clusters_left: int = 0             # distinct Fused clusters left to the model (an op without a program, ...)

    @property
    def priced(self) -> bool:
        return bool(self.compiled or self.ops or self.clusters)

    def cluster_kernels(self) -> dict[ClusterCall, CompiledProgram]:
        """Each compiled Fused eager cluster -> what XLA built for it."""
        return {call: c.built for call, c in self.clusters.items()}

    def op_kernels(self) -> dict[str, CompiledProgram]:
        """Each compiled eager op signature (``tpusim.trace.records.record_signature``) -> what XLA built."""
        return {key: op.built for key, op in self.ops.items()}

    def kernels(self) -> dict[int, CompiledProgram]:
        """Each compiled program execution (``OpRecord.program``) -> what XLA built for it."""
        return {n: p.built for p in self.compiled for n in p.programs}


def use_compiler(choice: str) -> bool:
    """Whether ``--compiler`` asks for XLA here: xla always (a missing extra is then an error), auto where
    the extra is installed, model never."""
    if choice == "model":
        return False
    return choice == "xla" or missing() is None


def estimate_programs(trace: Trace, chip: ChipSpec,
                      progress: Callable[[str], None] | None = None) -> XlaEstimates:
    """Compile each of the trace's graphs for ``chip`` (cached) and read what XLA built. A graph with
    collectives is compiled whole over its group first; its segments only where that fails."""
    modules = sorted(trace.meta.xla_modules or (), key=lambda m: m.devices == 1)     # whole graphs first
    compiled: list[ProgramEstimate] = []
    fell_back: list[str] = []
    covered: set[int] = set()
    for module in modules:
        runs = tuple(n for n in module.programs if n not in covered)
        if not runs:
            continue                         # its graph was compiled whole: nothing left for this segment
        try:
            if module.error:
                raise XlaUnavailable(module.error)
            target = target_for(chip, module.devices)
            if progress:
                progress(f"TPU compiler: {module.label}" + (f" ({module.devices} devices)" if module.devices > 1
                                                            else ""))
            result = compile_stablehlo(module.stablehlo, target)
            program = read_program(result.hlo)
            estimate = ProgramEstimate(module.label, runs, len(program.fusions),
                                       program.estimated_cycles / target.clock_hz,
                                       result.memory.get("peak_memory_in_bytes", 0), result.compile_s,
                                       result.cached, program_records(program, module.segments), module.devices)
            compiled.append(estimate)
            covered.update(estimate.executions)
        except XlaUnavailable as why:
            fell_back.append(f"{module.label}: {why}" + (" (its segments are compiled one by one)"
                                                         if module.devices > 1 else ""))
    ops, ops_fell_back = estimate_ops(trace, chip, progress)
    clusters, left = estimate_clusters(trace, chip, progress)
    return XlaEstimates(tuple(compiled), tuple(fell_back), ops, ops_fell_back, clusters, left)


def estimate_clusters(trace: Trace, chip: ChipSpec, progress: Callable[[str], None] | None = None
                      ) -> tuple[dict[ClusterCall, OpEstimate], int]:
    """Compile each distinct Fused eager cluster, composed from its ops' programs (``tpusim.xla.clusters``), all in
    one worker process; the compiled ones, and how many were left to the model."""
    modules = {m.label: m.stablehlo for m in trace.meta.xla_ops or () if m.stablehlo}
    if not modules:
        return {}, 0
    try:
        target = target_for(chip)
    except XlaUnavailable:
        return {}, 0
    found: list[tuple[int, int, ClusterCall]] = []       # the clusters of the first rank, as Fused forms them
    fuse(next(iter(rank_records(trace).values()), ()), chip, eager=True, clusters_out=found)
    calls = list(dict.fromkeys(call for _, _, call in found))
    texts = {call: compose(call, modules) for call in calls}
    ready = [call for call in calls if texts[call]]
    if progress and ready:
        progress(f"TPU compiler: {len(ready)} Fused eager clusters")
    built = zip(ready, _compile_small([texts[c] for c in ready], target))
    clusters = {call: result for call, result in built if isinstance(result, OpEstimate)}
    return clusters, len(calls) - len(clusters)


def _compile_small(texts: list[str], target: XlaTarget) -> list[OpEstimate | XlaUnavailable]:
    """Many small programs (eager ops, Fused clusters) in one worker process: what XLA built, or why not."""
    def estimate(result: Compiled | XlaUnavailable) -> OpEstimate | XlaUnavailable:
        if isinstance(result, XlaUnavailable):
            return result
        try:
            program = read_program(result.hlo)
        except XlaUnavailable as why:
            return why
        return OpEstimate(program.estimated_cycles / target.clock_hz, program_records(program))

    return [estimate(result) for result in compile_many(texts, target)]


def read_program(hlo: str) -> XlaProgram:
    """XLA's program text read, or ``XlaUnavailable`` saying why it could not be (text that does not parse
    prices that program by the model, never stops the run)."""
    try:
        return parse_program(hlo)
    except (ValueError, LookupError, TypeError, AttributeError) as error:
        raise XlaUnavailable(f"XLA's program could not be read ({type(error).__name__}: {error})"[:300]) from None


def estimate_ops(trace: Trace, chip: ChipSpec, progress: Callable[[str], None] | None = None
                 ) -> tuple[dict[str, OpEstimate], dict[str, str]]:
    """Compile each distinct eager op's one-op program (``TraceMeta.xla_ops``) for one device of ``chip``, all in
    one worker process; per signature, what XLA built or why the model prices it."""
    modules = trace.meta.xla_ops or ()
    fell_back = {m.label: m.error for m in modules if m.error}
    lowered = [m for m in modules if not m.error]
    if not lowered:
        return {}, fell_back
    try:
        target = target_for(chip)
    except XlaUnavailable as why:
        return {}, {**fell_back, **{m.label: str(why) for m in lowered}}
    if progress:
        progress(f"TPU compiler: {len(lowered)} eager op signatures")
    ops: dict[str, OpEstimate] = {}
    for module, result in zip(lowered, _compile_small([m.stablehlo for m in lowered], target)):
        if isinstance(result, XlaUnavailable):
            fell_back[module.label] = str(result)
        else:
            ops[module.label] = result
    return ops, fell_back
