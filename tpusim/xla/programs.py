"""A trace's programs through the TPU compiler: what XLA built for each, or why the model prices it.

Three kinds of program, each compiled once per distinct text (cached on disk, ``tpusim.xla.compiler``), all of
a run's together (``compile_all``: the uncached ones on a pool of worker processes, one per core):

- **torch.compile graphs** (``TraceMeta.xla_modules``), for one device of the run's chip; a graph with
  collectives first whole, over its group's devices, and segment by segment only where that fails;
- **eager ops** (``TraceMeta.xla_ops``): each distinct op's one-op program, run in Strict and Debug;
- **Fused eager clusters**: each distinct cluster's program, composed from its ops' (``tpusim.xla.clusters``).

What XLA built prices the program: its fusions and collectives become the records tpusim's engine runs
(``tpusim.xla.kernels``), and XLA's estimated cycles over the chip's clock is XLA's own estimate, set
beside tpusim's in the report (``tpusim.report.xla``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from tpusim.eager.fusion import ClusterCall, CompiledProgram, FusedKernel, fuse
from tpusim.hardware.calibration import band_key, error_bands
from tpusim.hardware.spec import ChipSpec
from tpusim.trace.records import Trace, XlaModule, rank_records
from tpusim.xla.clusters import compose
from tpusim.xla.compiler import (
    Compiled,
    XlaTarget,
    XlaUnavailable,
    compile_all,
    compile_many,
    default_workers,
    missing,
    target_for,
)
from tpusim.xla.hlo import XlaProgram, parse_program
from tpusim.xla.kernels import program_records

COMPILERS = ("auto", "xla", "model")   # --compiler: auto = the path with the better validated error (auto_declined)


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
    ``auto_declined`` finds no reason against it, model never."""
    if choice == "model":
        return False
    return choice == "xla" or auto_declined() is None


def auto_declined() -> str | None:
    """Why ``--compiler auto`` does not take the TPU compiler here, in one line; None when it does. auto takes the
    path whose compiled programs `tpusim validate` found closer to published runs (the held-out mean |error| of
    each path's compile band, topologies/fidelity/error_bands.toml): the TPU compiler's only where the xla extra
    is installed and its band is measured and no worse than tpusim's model's."""
    why = missing()
    if why:
        return why
    bands = error_bands()
    xla, model = bands.get(band_key("compile", "xla")), bands.get(band_key("compile"))
    if xla is None:
        return ("auto takes the TPU compiler's programs once `tpusim validate --compiler xla --write-bands` has "
                "measured them against published runs, which it has not; --compiler xla asks for them anyway")
    if model is not None and float(xla["mean_abs_error"]) > float(model["mean_abs_error"]):
        return (f"auto takes the path closer to published runs: tpusim's model (±{float(model['mean_abs_error']):.1%} "
                f"over {model['cases']} cases) over the TPU compiler's (±{float(xla['mean_abs_error']):.1%} over "
                f"{xla['cases']}); --compiler xla asks for it anyway")
    return None


class Counter(Protocol):
    """A progress that can count (``tpusim.run.progress.Progress``): "XLA: compiling 3 of 40 programs..."."""

    def __call__(self, text: str) -> None: ...

    def count(self, phase: str, done: int, total: int, unit: str) -> None: ...


def compile_progress(progress: Callable[[str], None] | None,
                     workers: int | None = None) -> Callable[[int, int], None] | None:
    """``compile_all``'s progress for a run's ``progress``: a status line as the compiles start, then the count
    of programs compiled, where ``progress`` can count (``Counter``)."""
    if progress is None:
        return None
    count = getattr(progress, "count", None)
    began = [0.0]

    def report(done: int, total: int) -> None:
        if done == 0:
            began[0] = time.perf_counter()
            progress(f"XLA: compiling {total} program{'s' if total != 1 else ''} on "
                     f"{min(total, workers or default_workers())} worker process(es); each is cached for the next "
                     f"run")
        if count is not None:
            count("XLA: compiling", done, total, "programs")
        if done == total and done:
            progress(f"XLA: compiled {total} program{'s' if total != 1 else ''} in "
                     f"{time.perf_counter() - began[0]:.1f} s")
    return report


@dataclass
class _Jobs:
    """The programs of one ``compile_all``: each job's (module text, target), and what each came to."""

    jobs: list[tuple[str, XlaTarget]] = field(default_factory=list)
    results: list[Compiled | XlaUnavailable] = field(default_factory=list)

    def add(self, text: str, target: XlaTarget) -> int:
        self.jobs.append((text, target))
        return len(self.jobs) - 1

    def run(self, progress: Callable[[int, int], None] | None, workers: int | None) -> None:
        self.results = compile_all(self.jobs, workers=workers, progress=progress)


def estimate_programs(trace: Trace, chip: ChipSpec, progress: Callable[[str], None] | None = None, *,
                      workers: int | None = None) -> XlaEstimates:
    """Compile each of the trace's graphs, eager ops and Fused clusters for ``chip`` (cached; the uncached on
    ``workers`` processes at once, all in one pool) and read what XLA built. A graph with collectives is
    compiled whole over its group first; its segments only where that fails (then in a second pool)."""
    modules = sorted(trace.meta.xla_modules or (), key=lambda m: m.devices == 1)     # whole graphs first
    report = compile_progress(progress, workers)
    first = _Jobs()
    graphs = _graph_jobs(modules, chip, first)
    later = [i for i, m in enumerate(modules) if not m.error and i not in graphs and m.devices == 1]
    ops = _op_jobs(trace, chip, first)
    clusters = _cluster_jobs(trace, chip, first)
    first.run(report, workers)
    found: dict[int, Compiled | XlaUnavailable] = {i: first.results[job] for i, job in graphs.items()}
    compiled, fell_back, covered = _graph_estimates(modules, chip, found)
    second = _Jobs()                              # segments of whole graphs that failed
    pending = [i for i in later if not set(modules[i].programs) <= covered]
    retry = {pending[j]: job for j, job in
             _graph_jobs([modules[i] for i in pending], chip, second, whole_first=False).items()}
    if retry:
        second.run(report, workers)
        found.update({i: second.results[job] for i, job in retry.items()})
        compiled, fell_back, _ = _graph_estimates(modules, chip, found)
    return XlaEstimates(tuple(compiled), tuple(fell_back), *ops.estimates(first), *clusters.estimates(first))


def _graph_jobs(modules: list[XlaModule], chip: ChipSpec, jobs: _Jobs, whole_first: bool = True) -> dict[int, int]:
    """The graphs to compile (module index -> job). With ``whole_first``, a segment that a whole graph stands for
    (its runs and the segments after each) is left out: it is compiled only where the whole graph fails."""
    whole: set[int] = set()
    for module in modules:
        if whole_first and module.devices > 1 and not module.error:
            whole.update(n + i for n in module.programs for i in range(module.segments))
    now: dict[int, int] = {}
    for i, module in enumerate(modules):
        if module.error or (module.devices == 1 and set(module.programs) <= whole):
            continue
        try:
            now[i] = jobs.add(module.stablehlo, target_for(chip, module.devices))
        except XlaUnavailable:
            continue                                 # _graph_estimates says why
    return now


def _graph_estimates(modules: list[XlaModule], chip: ChipSpec, found: dict[int, Compiled | XlaUnavailable]
                     ) -> tuple[list[ProgramEstimate], list[str], set[int]]:
    """What XLA built for each graph (whole graphs first: a segment stands only for the runs no whole graph
    covers), what fell back and why, and the program executions the compiled graphs cover."""
    compiled: list[ProgramEstimate] = []
    fell_back: list[str] = []
    covered: set[int] = set()
    for i, module in enumerate(modules):
        runs = tuple(n for n in module.programs if n not in covered)
        if not runs:
            continue                         # its graph was compiled whole: nothing left for this segment
        try:
            if module.error:
                raise XlaUnavailable(module.error)
            target = target_for(chip, module.devices)
            result = found.get(i, XlaUnavailable("not compiled"))
            if isinstance(result, XlaUnavailable):
                raise result
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
    return compiled, fell_back, covered


@dataclass
class _OpJobs:
    """The eager ops' one-op programs of a ``_Jobs``: signature -> job, and those the model prices and why."""

    jobs: dict[str, int] = field(default_factory=dict)
    fell_back: dict[str, str] = field(default_factory=dict)
    target: XlaTarget | None = None

    def estimates(self, done: _Jobs) -> tuple[dict[str, OpEstimate], dict[str, str]]:
        """Per signature, what XLA built, or why the model prices it."""
        ops: dict[str, OpEstimate] = {}
        fell_back = dict(self.fell_back)
        for label, job in self.jobs.items():
            result = _small_estimate(done.results[job], self.target)
            if isinstance(result, XlaUnavailable):
                fell_back[label] = str(result)
            else:
                ops[label] = result
        return ops, fell_back


def _op_jobs(trace: Trace, chip: ChipSpec, jobs: _Jobs) -> _OpJobs:
    """Each distinct eager op's one-op program (``TraceMeta.xla_ops``) for one device of ``chip``."""
    modules = trace.meta.xla_ops or ()
    out = _OpJobs(fell_back={m.label: m.error for m in modules if m.error})
    lowered = [m for m in modules if not m.error]
    if not lowered:
        return out
    try:
        out.target = target_for(chip)
    except XlaUnavailable as why:
        out.fell_back.update({m.label: str(why) for m in lowered})
        return out
    out.jobs = {m.label: jobs.add(m.stablehlo, out.target) for m in lowered}
    return out


@dataclass
class _ClusterJobs:
    """The Fused eager clusters of a ``_Jobs``: the composed ones -> job, and how many distinct clusters there are."""

    jobs: dict[ClusterCall, int] = field(default_factory=dict)
    distinct: int = 0
    target: XlaTarget | None = None

    def estimates(self, done: _Jobs) -> tuple[dict[ClusterCall, OpEstimate], int]:
        """The compiled clusters, and how many were left to the model."""
        built = {call: _small_estimate(done.results[job], self.target) for call, job in self.jobs.items()}
        clusters = {call: result for call, result in built.items() if isinstance(result, OpEstimate)}
        return clusters, self.distinct - len(clusters)


def _cluster_jobs(trace: Trace, chip: ChipSpec, jobs: _Jobs) -> _ClusterJobs:
    """Each distinct Fused eager cluster's program, composed from its ops' programs (``tpusim.xla.clusters``)."""
    modules = {m.label: m.stablehlo for m in trace.meta.xla_ops or () if m.stablehlo}
    if not modules:
        return _ClusterJobs()
    try:
        target = target_for(chip)
    except XlaUnavailable:
        return _ClusterJobs()
    found: list[tuple[int, int, ClusterCall]] = []       # the clusters of the first rank, as Fused forms them
    fuse(next(iter(rank_records(trace).values()), ()), chip, eager=True, clusters_out=found)
    calls = list(dict.fromkeys(call for _, _, call in found))
    texts = {call: compose(call, modules) for call in calls}
    return _ClusterJobs({call: jobs.add(text, target) for call, text in texts.items() if text}, len(calls), target)


def estimate_clusters(trace: Trace, chip: ChipSpec, progress: Callable[[str], None] | None = None
                      ) -> tuple[dict[ClusterCall, OpEstimate], int]:
    """Compile each distinct Fused eager cluster, composed from its ops' programs (``tpusim.xla.clusters``); the
    compiled ones, and how many were left to the model."""
    jobs = _Jobs()
    clusters = _cluster_jobs(trace, chip, jobs)
    jobs.run(compile_progress(progress), None)
    return clusters.estimates(jobs)


def estimate_ops(trace: Trace, chip: ChipSpec, progress: Callable[[str], None] | None = None
                 ) -> tuple[dict[str, OpEstimate], dict[str, str]]:
    """Compile each distinct eager op's one-op program (``TraceMeta.xla_ops``) for one device of ``chip``; per
    signature, what XLA built or why the model prices it."""
    jobs = _Jobs()
    ops = _op_jobs(trace, chip, jobs)
    jobs.run(compile_progress(progress), None)
    return ops.estimates(jobs)


def _small_estimate(result: Compiled | XlaUnavailable, target: XlaTarget | None) -> OpEstimate | XlaUnavailable:
    """A small program (an eager op, a Fused cluster) as XLA built it, or why not."""
    if isinstance(result, XlaUnavailable):
        return result
    try:
        program = read_program(result.hlo)
    except XlaUnavailable as why:
        return why
    clock = target.clock_hz if target is not None else 1.0
    return OpEstimate(program.estimated_cycles / clock, program_records(program))


def _compile_small(texts: list[str], target: XlaTarget) -> list[OpEstimate | XlaUnavailable]:
    """Many small programs (eager ops, Fused clusters) for one target: what XLA built, or why not."""
    return [_small_estimate(result, target) for result in compile_many(texts, target)]


def read_program(hlo: str) -> XlaProgram:
    """XLA's program text read, or ``XlaUnavailable`` saying why it could not be (text that does not parse
    prices that program by the model, never stops the run)."""
    try:
        return parse_program(hlo)
    except (ValueError, LookupError, TypeError, AttributeError) as error:
        raise XlaUnavailable(f"XLA's program could not be read ({type(error).__name__}: {error})"[:300]) from None
