"""``torch.compile(model, backend="tpu")``: Dynamo graph -> AOT autograd (Core ATen) -> JAX -> jax.jit.

Pipeline: Dynamo captures a graph; ``aot_autograd`` functionalises it, splits forward and
backward (so training works) and decomposes it to Core ATen with PyTorch's own decomposition
table; each graph becomes one JAX function through the lowering table (backend/lowering/), is
``jax.jit``-compiled once per input signature into one XLA program (StableHLO) and runs on JAX's
default device (a TPU where JAX sees one, else CPU/GPU). Inputs are read from the tensors' host
memory, outputs land in fresh tensors on the inputs' device. A graph that uses an op the table
lacks runs eagerly instead (op by op on the device), with a warning naming the ops.

On the sim target, while a recording runs, every execution of a compiled graph is recorded as
its ops (backend/program.py) marked as one program, which the simulator prices as one XLA
program: fused as a whole, launched once, compiled once per signature (tpusim/fusion.py).

Observability: ``compile_stats()`` lists graph breaks (reason, user source line) and
recompilations (function, reason) from Dynamo's own records, and the compiled graphs (a
recording's ``trace.meta.torch_compile`` gets them too: ``install`` adds a recorder meta source);
``dump_stablehlo(fn, *inputs)`` returns the StableHLO text of what ``fn`` compiles to;
TPUSIM_DUMP_STABLEHLO=<dir> writes each compiled graph's StableHLO to ``<dir>/graph_<n>_<kind>.mlir``.

Dynamo, AOT autograd and jax (with the lowering table, which imports it) are imported inside the
functions that use them: Dynamo and AOT autograd cost seconds and jax is an optional extra, and
this module loads with the device at ``import torch``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.fx
from tpusim.backend import recorder
from tpusim.backend.import_hooks import after_import
from tpusim.backend.program import Program, program_of
from tpusim.backend.source import is_internal_file
from tpusim.backend.state import STATE
from tpusim.backend.targets import flush_pending

from tpusim import trace as trace_meta

BACKEND = "tpu"


@dataclass(frozen=True)
class GraphBreak:
    reason: str
    source: str            # "file:line" of the user's code where Dynamo broke the graph


@dataclass(frozen=True)
class Recompile:
    function: str          # "name (file:line)"
    reason: str            # the guard that failed


@dataclass(frozen=True)
class CompiledGraph:
    index: int
    kind: str              # "forward", "backward" or "inference"
    ops: int               # aten call nodes
    lowered: bool          # False: ran eagerly (ops missing from the table)
    missing: tuple[str, ...] = ()


@dataclass
class CompileStats:
    graphs: list[CompiledGraph] = field(default_factory=list)
    graph_breaks: list[GraphBreak] = field(default_factory=list)
    recompiles: list[Recompile] = field(default_factory=list)

    def summary(self) -> str:
        lines = [f"tpu compile: {len(self.graphs)} graphs, {len(self.graph_breaks)} graph breaks, "
                 f"{len(self.recompiles)} recompilations"]
        lines += [f"  graph break at {b.source}: {b.reason}" for b in self.graph_breaks]
        lines += [f"  recompiled {r.function}: {r.reason}" for r in self.recompiles]
        lines += [f"  graph {g.index} ({g.kind}) ran eagerly, missing {', '.join(g.missing)}"
                  for g in self.graphs if not g.lowered]
        return "\n".join(lines)


class _Registry:
    graphs: list[CompiledGraph] = []
    capture: list[str] | None = None        # StableHLO texts while dump_stablehlo runs


_REG = _Registry()


def compile_stats() -> CompileStats:
    """Graphs compiled by the tpu backend, and Dynamo's graph breaks and recompilations, since reset_stats()."""
    from torch._dynamo.utils import get_compilation_metrics, graph_break_reasons  # Dynamo: heavy, see above

    breaks, seen = [], set()
    for r in graph_break_reasons:
        frames = [f for f in r.user_stack or () if not is_internal_file(f.filename)] or list(r.user_stack or ())
        frame = frames[-1] if frames else None
        source = f"{frame.filename}:{frame.lineno}" if frame else "?"
        if (r.reason, source) not in seen:
            seen.add((r.reason, source))
            breaks.append(GraphBreak(r.reason.strip().splitlines()[0], source))
    recompiles = [Recompile(f"{m.co_name} ({m.co_filename}:{m.co_firstlineno})", m.recompile_reason.strip())
                  for m in get_compilation_metrics() if m.recompile_reason]
    return CompileStats(list(_REG.graphs), breaks, recompiles)


def trace_facts() -> trace_meta.CompileFacts:
    """``compile_stats()`` for a trace's meta (``TraceMeta.torch_compile``; tpusim/lint.py reads it)."""
    stats = compile_stats()
    return trace_meta.CompileFacts(
        graphs=len(stats.graphs),
        graph_breaks=tuple(trace_meta.GraphBreak(b.reason, b.source) for b in stats.graph_breaks),
        recompiles=tuple(trace_meta.DynamoRecompile(r.function, r.reason) for r in stats.recompiles),
        eager_graphs=tuple(trace_meta.EagerGraph(f"graph {g.index} ({g.kind})", tuple(g.missing))
                           for g in stats.graphs if not g.lowered))


def _trace_meta() -> dict:
    """Recorder meta source (``install``): ``torch_compile`` when the program used torch.compile."""
    if "torch._dynamo" not in sys.modules:      # never imported: no graph, break or recompile to report
        return {}
    stats = compile_stats()
    if not (stats.graphs or stats.graph_breaks or stats.recompiles):
        return {}
    return {"torch_compile": trace_facts()}


def reset_stats() -> None:
    """Forget compiled graphs, graph breaks and recompilations (also resets Dynamo's caches)."""
    import torch._dynamo  # Dynamo: heavy, see the module docstring
    from torch._dynamo.utils import clear_compilation_metrics

    torch._dynamo.reset()
    clear_compilation_metrics()
    _REG.graphs.clear()


def _host(t: torch.Tensor) -> torch.Tensor:
    """A CPU view of a tensor's memory (zero-copy for tpu tensors)."""
    if t.device.type == "tpu":
        return STATE.shim.host_alias(t)
    return t


def _to_device(outs: list[torch.Tensor], devices: list[torch.device]) -> list[torch.Tensor]:
    result = []
    for t, dev in zip(outs, devices):
        if dev.type == "tpu":
            result.append(STATE.shim.to_device([t], dev.index if dev.index is not None else 0)[0])
        else:
            result.append(t if dev.type == "cpu" else t.to(dev))
    return result


def _output_devices(gm: torch.fx.GraphModule) -> list[torch.device | None]:
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    vals = out.args[0] if isinstance(out.args[0], (tuple, list)) else [out.args[0]]
    devices = []
    for v in vals:
        meta = v.meta.get("val") if isinstance(v, torch.fx.Node) else None
        devices.append(meta.device if isinstance(meta, torch.Tensor) else None)
    return devices


def _spec(t: object) -> object:
    import jax  # jax: an optional extra, see the module docstring
    from tpusim.backend.lowering.dtypes import jax_dtype

    if isinstance(t, torch.Tensor):
        return jax.ShapeDtypeStruct(tuple(int(s) for s in t.shape), jax_dtype(t.dtype))
    return t


class JaxGraph:
    """One Core ATen graph as a jitted JAX function, called with and returning torch tensors."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: list, kind: str, index: int = 0) -> None:
        import jax  # jax and the lowering table: an optional extra, see the module docstring
        from tpusim.backend.lowering import jax_function
        from tpusim.backend.lowering.interpreter import needs_random

        self.gm = gm
        self.kind = kind
        self.fn = jax_function(gm)
        self.random = needs_random(gm)
        self.jitted = jax.jit(self.fn)
        self.devices = _output_devices(gm)
        self.specs = [_spec(t) for t in example_inputs]
        self.label = f"graph {index} ({kind})"
        self._program: Program | None = None        # built at the first recorded call
        self._boxed_call = True

    def _record(self, inputs: list, outputs: list) -> None:
        """While recording: this execution's ops, priced by the simulator as one program."""
        if self._program is None:
            self._program = program_of(self.gm, self.label)
        recorder.record_program(self._program, inputs, outputs)

    def lower(self) -> object:
        """The jax ``Lowered`` of this graph at its example shapes (``.as_text()`` is StableHLO)."""
        import jax  # jax: an optional extra, see the module docstring

        specs = list(self.specs)
        if self.random:
            specs.append(jax.ShapeDtypeStruct((2,), "uint32"))
        return self.jitted.lower(*specs)

    def __call__(self, args: list) -> list:
        import jax  # jax and the lowering table: an optional extra, see the module docstring
        from tpusim.backend.lowering import jax_to_tensor, tensor_to_numpy
        from tpusim.backend.lowering.dtypes import torch_dtype

        flush_pending("program")                         # the PJRT target's pending ops write our inputs
        shapes_only = STATE.numerics is False           # tensors have no memory: shapes and dtypes only
        convert = _spec if shapes_only else (lambda t: tensor_to_numpy(_host(t)))
        inputs = [convert(a) if isinstance(a, torch.Tensor) else a for a in args]
        bound = list(args) if STATE.recording else []
        args.clear()                                     # boxed convention: free inputs early
        if self.random:
            seed = int(torch.randint(0, 2**31 - 1, (1,)).item())
            inputs.append(jax.random.PRNGKey(seed))
        if shapes_only:
            outs = jax.eval_shape(self.fn, *inputs)
            empty = [torch.empty(o.shape, dtype=torch_dtype(o.dtype), device=d or "cpu") if hasattr(o, "shape")
                     else o for o, d in zip(outs, self.devices)]
            if bound:
                self._record(bound, empty)
            return empty
        outs = self.jitted(*inputs)
        result, devices, slots = [], [], []
        for i, (o, d) in enumerate(zip(outs, self.devices)):
            if isinstance(o, jax.Array):
                slots.append(i)
                devices.append(d or torch.device("cpu"))
                result.append(jax_to_tensor(o))
        final = list(outs)
        for i, t in zip(slots, _to_device(result, devices)):
            final[i] = t
        if bound:
            self._record(bound, final)
        return final


def _compiler(kind: str) -> Callable:
    def compile_graph(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        from torch._functorch.aot_autograd import make_boxed_func  # heavy, and the lowering imports jax
        from tpusim.backend.lowering import MissingLowering

        index = len(_REG.graphs)
        ops = sum(1 for n in gm.graph.nodes if n.op == "call_function")
        try:
            graph = JaxGraph(gm, example_inputs, kind, index)
        except MissingLowering as err:
            warnings.warn(f"tpusim: torch.compile graph {index} ({kind}) runs eagerly: no JAX lowering for "
                          f"{', '.join(err.ops)}", RuntimeWarning, stacklevel=2)
            _REG.graphs.append(CompiledGraph(index, kind, ops, False, tuple(err.ops)))
            return make_boxed_func(gm.forward)
        _REG.graphs.append(CompiledGraph(index, kind, ops, True))
        _dump(graph, index)
        return graph

    return compile_graph


def _dump(graph: JaxGraph, index: int) -> None:
    folder = os.environ.get("TPUSIM_DUMP_STABLEHLO", "").strip()
    if not folder and _REG.capture is None:
        return
    text = graph.lower().as_text()
    if _REG.capture is not None:
        _REG.capture.append(f"// tpusim graph {index} ({graph.kind})\n{text}")
    if folder:
        path = Path(folder)
        path.mkdir(parents=True, exist_ok=True)
        (path / f"graph_{index}_{graph.kind}.mlir").write_text(text)


def _inference_compiler(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    return _compiler("inference")(gm, example_inputs)


def tpu_backend(gm: torch.fx.GraphModule, example_inputs: list, **kwargs: object) -> Callable:
    """The Dynamo backend: AOT autograd with Core ATen decompositions, each graph lowered to JAX."""
    from torch._decomp import core_aten_decompositions  # Dynamo and AOT autograd: heavy, see above
    from torch._dynamo.backends.common import aot_autograd

    return aot_autograd(fw_compiler=_compiler("forward"), bw_compiler=_compiler("backward"),
                        inference_compiler=_inference_compiler,
                        decompositions=core_aten_decompositions())(gm, example_inputs, **kwargs)


@contextlib.contextmanager
def capture_stablehlo() -> Iterator[list[str]]:
    """Collect the StableHLO text of every graph the tpu backend compiles inside the block."""
    saved, _REG.capture = _REG.capture, []
    try:
        yield _REG.capture
    finally:
        _REG.capture = saved


def dump_stablehlo(fn_or_module: Callable, *example_inputs: object, path: str | os.PathLike | None = None) -> str:
    """StableHLO of ``fn_or_module(*example_inputs)`` compiled by the tpu backend (forward and, when an
    output requires grad, backward graphs, separated by ``// tpusim graph`` comments). Writes ``path`` if given."""
    compiled = torch.compile(fn_or_module, backend=BACKEND)
    params = list(fn_or_module.parameters()) if isinstance(fn_or_module, torch.nn.Module) else []
    grads = [p.grad for p in params]
    with capture_stablehlo() as texts:
        out = compiled(*example_inputs)
        loss = next((t for t in torch.utils._pytree.tree_leaves(out)
                     if isinstance(t, torch.Tensor) and t.requires_grad), None)
        if loss is not None:
            loss.sum().backward()
    for p, g in zip(params, grads):     # leave the module's .grad as it was
        p.grad = g
    text = "\n".join(texts)
    if path is not None:
        Path(path).write_text(text)
    return text


def _register(registry: object) -> None:
    if BACKEND not in registry._COMPILER_FNS:
        registry.register_backend(compiler_fn=tpu_backend, name=BACKEND)


def _skip_tpusim(trace_rules: object) -> None:
    """Dynamo must never trace tpusim itself: the recorder's hooks run from inside ops (.item(), copies)
    while a frame is being compiled, and tracing them would add graph breaks of ours to the user's."""
    for package in ("tpusim", "tpusim.backend"):
        trace_rules.add(package)


def install() -> None:
    """Make ``backend="tpu"`` known to torch.compile when Dynamo is imported (it costs seconds, so not
    before), and report its graphs in every recording's meta (backend/device.py calls this)."""
    after_import("torch._dynamo.backends.registry", _register)
    after_import("torch._dynamo", lambda dynamo: _skip_tpusim(dynamo.trace_rules))
    recorder.add_meta_source(_trace_meta)
