"""``torch.compile(model, backend="tpu")``: Dynamo graph -> AOT autograd (Core ATen) -> JAX -> jax.jit.

Pipeline: Dynamo captures a graph; ``aot_autograd`` functionalises it, splits forward and
backward (so training works) and decomposes it to Core ATen with PyTorch's own decomposition
table; each graph becomes one JAX function through the lowering table (tpusim/backend/lowering/), is
``jax.jit``-compiled once per input signature into one XLA program (StableHLO) and runs on JAX's
default device (a TPU where JAX sees one, else CPU/GPU). Inputs are read from the tensors' host
memory, outputs land in fresh tensors on the inputs' device. A graph that uses an op the table
lacks runs eagerly instead (op by op on the device), with a warning naming the ops. With --numerics tpu a
graph runs its Core ATen ops on the host at the TPU's precision instead of through JAX
(tpusim/backend/dispatch/tpu_numerics.py).

On the sim target, while a recording runs, every execution of a compiled graph is recorded as
its ops (tpusim/backend/program_trace/compiled_program.py) marked as one program, which the simulator prices as one XLA
program: fused as a whole, launched once, compiled once per signature (tpusim/eager/fusion.py).

``torch.compile(model)`` with no backend uses this backend for graphs whose inputs are on "tpu" (and
Inductor, PyTorch's default, for the rest), as TorchTPU does: ``install`` makes ``auto_backend`` Dynamo's
default. TorchTPU's options are accepted (``options={...}``, checked by ``OPTIONS``): ``debug_callback``
receives a ``TpuCompileDebug`` (TorchTPU's container: the FX graphs before and after AOT autograd and the
StableHLO text of the forward and backward graphs, filled as they compile) and ``name`` prefixes the
graphs' labels; ``async_compile``, ``num_dynamic_buckets``, ``bucket_size``, ``serializable``,
``bounded_dynamism`` and ``tpu_backend`` are checked and change nothing (compiles are synchronous here,
shapes are static per signature, and the AOT autograd cache is PyTorch's own); ``mode`` is ignored (XLA has
one). Each execution of a compiled graph is a request to the live compile cache of tpusim/backend/torchtpu/cache.py
(``torch.tpu._get_cache_stats()``): the first with an input signature compiles, later ones hit.

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
import functools
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.fx

from tpusim.backend.dispatch.tpu_numerics import GraphNumerics, graph_numerics
from tpusim.backend.plumbing.import_hooks import after_import
from tpusim.backend.plumbing.source import is_internal_file, user_source
from tpusim.backend.plumbing.state import STATE
from tpusim.backend.program_trace import recorder
from tpusim.backend.program_trace.compiled_program import Program, program_of
from tpusim.backend.targets import flush_pending
from tpusim.backend.torch_compile.collective_graph import SegmentedGraph, has_collectives, is_collective
from tpusim.backend.torchtpu import cache
from tpusim.errors import TpusimError
from tpusim.trace import records as trace_meta

BACKEND = "tpu"


@dataclass(frozen=True)
class CompiledGraph:
    index: int
    kind: str              # "forward", "backward" or "inference"
    ops: int               # aten call nodes
    lowered: bool          # False: ran eagerly (ops missing from the table)
    missing: tuple[str, ...] = ()
    segments: int = 1      # XLA programs it runs as: functional collectives split it (collective_graph.py)
    collectives: int = 0   # functional collectives in it, run by c10d between the segments


@dataclass
class CompileStats:
    graphs: list[CompiledGraph] = field(default_factory=list)
    graph_breaks: list[trace_meta.GraphBreak] = field(default_factory=list)
    recompiles: list[trace_meta.DynamoRecompile] = field(default_factory=list)

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
    previous_default: object = "inductor"   # torch.compile's default backend before auto_backend
    inference_mode: dict[str, None] = {}    # user lines that ran a compiled graph under torch.inference_mode()


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
            breaks.append(trace_meta.GraphBreak(_break_reason(r), source))
    recompiles = [trace_meta.DynamoRecompile(f"{m.co_name} ({m.co_filename}:{m.co_firstlineno})",
                                             m.recompile_reason.strip())
                  for m in get_compilation_metrics() if m.recompile_reason]
    return CompileStats(list(_REG.graphs), breaks, recompiles)


FSDP_HOOKS_BREAK = ("FSDP2's hooks of a fully_shard'ed submodule called inside the compiled module (FSDP2 marks "
                    "them not to be traced, so Dynamo splits the graph at the call and compiles the submodule apart)")
FSDP_HOOKS_FIX = ("; fully_shard only the compiled module, or compile its children around that submodule instead of "
                  "the module (torchtitan compiles an expert-parallel MoE block's children for this reason)")
CHECKPOINTED = ("; the module is activation-checkpointed, and Dynamo cannot split a checkpointed region: the whole "
                "module runs eagerly, op by op")
_CHECKPOINT_FILES = ("/torch/utils/checkpoint.py", "/_checkpoint/checkpoint_wrapper.py")


def _break_reason(record: object) -> str:
    """Dynamo's reason for a break, in one line; a break inside FSDP2's hooks (Dynamo's reason names only a skipped
    ``disable``) says what the user wrote that caused it, and what it costs inside activation checkpointing."""
    frames = [f.filename.replace("\\", "/") for f in record.user_stack or ()]
    if not any("/torch/distributed/fsdp/" in name for name in frames):
        return record.reason.strip().splitlines()[0]
    checkpointed = any(name.endswith(_CHECKPOINT_FILES) for name in frames)
    return FSDP_HOOKS_BREAK + (CHECKPOINTED if checkpointed else "") + FSDP_HOOKS_FIX


def trace_facts() -> trace_meta.CompileFacts:
    """``compile_stats()`` for a trace's meta (``TraceMeta.torch_compile``; tpusim/report/lint.py reads it)."""
    stats = compile_stats()
    return trace_meta.CompileFacts(
        graphs=len(stats.graphs),
        graph_breaks=tuple(stats.graph_breaks),
        recompiles=tuple(stats.recompiles),
        eager_graphs=tuple(trace_meta.EagerGraph(f"graph {g.index} ({g.kind})", tuple(g.missing))
                           for g in stats.graphs if not g.lowered))


def _trace_meta() -> dict:
    """Recorder meta source (``install``): ``torch_compile`` when the program used torch.compile."""
    if "torch._dynamo" not in sys.modules:      # never imported: no graph, break or recompile to report
        return {}
    stats = compile_stats()
    if not (stats.graphs or stats.graph_breaks or stats.recompiles):
        return {}
    under_inference_mode = {"inference_mode_compiles": tuple(_REG.inference_mode)} if _REG.inference_mode else {}
    return {"torch_compile": trace_facts(), **under_inference_mode}


def reset_stats() -> None:
    """Forget compiled graphs, graph breaks and recompilations (also resets Dynamo's caches)."""
    import torch._dynamo  # Dynamo: heavy, see the module docstring
    from torch._dynamo.utils import clear_compilation_metrics

    torch._dynamo.reset()
    clear_compilation_metrics()
    _REG.graphs.clear()
    _REG.inference_mode.clear()


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
    if isinstance(t, list | tuple):          # a segment's input can be a list of tensors (collective_graph.py)
        return type(t)(_spec(item) for item in t)
    return t


class SpmdGraph:
    """A graph with functional collectives lowered whole for the TPU compiler: one per-device program inside
    ``jax.shard_map`` over its collectives' group (tpusim/backend/lowering/collectives.py), so XLA schedules
    the collectives among the kernels as on a TPU. It never runs: the segments do (collective_graph.py)."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: list, label: str, segments: int) -> None:
        self.gm = gm
        self.specs = list(example_inputs)
        self.label = label
        self.segments = segments
        groups = {_group_of(n, example_inputs, gm) for n in gm.graph.nodes if is_collective(n) and len(n.args) > 1}
        self.groups = len({key for key, _ in groups})
        self.devices = max((size for _, size in groups), default=0) if self.groups == 1 else 0

    def stablehlo(self) -> str:
        """The whole graph's StableHLO for TPU over ``devices`` devices (raises when it cannot be one program)."""
        import jax  # jax and the lowering table: see the module docstring
        from jax.sharding import AbstractMesh, PartitionSpec

        from tpusim.backend.lowering import jax_function
        from tpusim.backend.lowering.collectives import AXIS, COLLECTIVES
        from tpusim.backend.lowering.interpreter import needs_random

        if self.groups != 1 or self.devices < 2:
            raise ValueError(f"its collectives span {self.groups} process groups of sizes it cannot tell "
                             f"(one program needs one group)")
        fn = jax_function(self.gm, COLLECTIVES)
        tensors = [i for i, t in enumerate(self.specs) if isinstance(t, torch.Tensor)]
        random = needs_random(self.gm)

        def per_device(*values: object) -> list:     # the process group and other non-tensors stay Python values
            args = list(self.specs)
            for i, value in zip(tensors, values):
                args[i] = value
            return [out for out in fn(*args, *values[len(tensors):]) if isinstance(out, jax.Array)]

        specs = [_spec(self.specs[i]) for i in tensors] + ([jax.ShapeDtypeStruct((2,), "uint32")] if random else [])
        spmd = jax.shard_map(per_device, mesh=AbstractMesh((self.devices,), (AXIS,)),
                             in_specs=PartitionSpec(), out_specs=PartitionSpec(), check_vma=False)
        return jax.jit(spmd).trace(*specs).lower(lowering_platforms=("tpu",)).as_text()


def _group_of(node: torch.fx.Node, example_inputs: list, gm: torch.fx.GraphModule) -> tuple[str, int]:
    """(which group, its size) of a functional collective: the size from its ``group_size`` argument, else
    from the process group it names (0 when neither tells)."""
    group = node.args[-1]
    size = next((a for a in node.args[1:-1] if isinstance(a, int) and not isinstance(a, bool)), 0)
    value = group
    if isinstance(group, torch.fx.Node) and group.op == "placeholder":
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        value = example_inputs[placeholders.index(group)] if placeholders.index(group) < len(example_inputs) else None
    if not size:
        try:
            from torch.distributed.distributed_c10d import _resolve_process_group

            real = getattr(value, "real_obj", value)
            size = int(real.size() if hasattr(real, "size") else _resolve_process_group(str(real)).size())
        except Exception:   # not a group it can resolve: the whole-graph lowering says so, the segments still run
            size = 0
    return str(getattr(group, "name", group)), size


class JaxGraph:
    """One Core ATen graph as a jitted JAX function, called with and returning torch tensors."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: list, kind: str, index: int = 0,
                 name: str = "", part: int | None = None) -> None:
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
        self.label = f"{name + ': ' if name else ''}graph {index} ({kind})" + ("" if part is None else f" part {part}")
        self._program: Program | None = None        # built at the first recorded call
        self._tpu_stablehlo: str | None = None      # tpu_stablehlo(), once asked
        self._boxed_call = True
        self.numerics: GraphNumerics | None = graph_numerics()   # --numerics tpu: fixed at compile, as XLA's

    def _record(self, inputs: list, outputs: list) -> None:
        """While recording: this execution's ops, priced by the simulator as one program."""
        if self._program is None:
            self._program = program_of(self.gm, self.label, self.tpu_stablehlo)
        recorder.record_program(self._program, inputs, outputs)

    def tpu_stablehlo(self) -> str:
        """This graph's StableHLO lowered for TPU (the TPU compiler's input: tpusim/xla/), lowered once."""
        if self._tpu_stablehlo is None:
            import jax  # jax: an optional extra, see the module docstring

            specs = list(self.specs) + ([jax.ShapeDtypeStruct((2,), "uint32")] if self.random else [])
            self._tpu_stablehlo = self.jitted.trace(*specs).lower(lowering_platforms=("tpu",)).as_text()
        return self._tpu_stablehlo

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
        key = f"{self.label} " + ",".join(f"{str(a.dtype)[6:]}{list(a.shape)}" if isinstance(a, torch.Tensor)
                                          else repr(a) for a in args)
        hit = cache.lookup(key)                          # torch.tpu._get_cache_stats(): one request per execution
        started = time.perf_counter()
        shapes_only = STATE.numerics is False           # tensors have no memory: shapes and dtypes only
        if self.numerics is not None and not shapes_only:
            return self._call_on_host(args, key, hit, started)
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
            if not hit:
                cache.compiled(key, time.perf_counter() - started)
            return empty
        outs = self.jitted(*inputs)
        if not hit:                                      # jax compiled it at this first call with its signature
            jax.block_until_ready(outs)
            cache.compiled(key, time.perf_counter() - started)
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


    def _call_on_host(self, args: list, key: str, hit: bool, started: float) -> list:
        """--numerics tpu: the graph's Core ATen ops on the host at the TPU's precision
        (tpusim/backend/dispatch/tpu_numerics.py), not through JAX, whose CPU computes every dot in f32."""
        bound = list(args) if STATE.recording else []
        outs = self.numerics.run(self.gm, [_hosted(a) for a in args])
        args.clear()                                     # boxed convention: free inputs early
        if not hit:
            cache.compiled(key, time.perf_counter() - started)
        final = list(outs)
        slots = [i for i, o in enumerate(outs) if isinstance(o, torch.Tensor)]
        devices = [self.devices[i] or torch.device("cpu") for i in slots]
        for i, t in zip(slots, _to_device([outs[i] for i in slots], devices)):
            final[i] = t
        if bound:
            self._record(bound, final)
        return final


def _hosted(value: object) -> object:
    """A graph input on the host: tensors as ``_host`` gives them, in lists too (a segment's input)."""
    if isinstance(value, torch.Tensor):
        return _host(value)
    if isinstance(value, list | tuple):
        return type(value)(_hosted(v) for v in value)
    return value


def _compiler(kind: str, debug: TpuCompileDebug | None = None, name: str = "") -> Callable:
    def compile_graph(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        from torch._functorch.aot_autograd import make_boxed_func  # heavy, and the lowering imports jax

        from tpusim.backend.lowering import MissingLowering

        index = len(_REG.graphs)
        ops = sum(1 for n in gm.graph.nodes if n.op == "call_function")
        if debug is not None:
            debug.add_graph(kind, gm)
        try:
            if has_collectives(gm):     # compiled segments with the collectives between them run by c10d
                graph = SegmentedGraph(gm, lambda sub, fakes, part: JaxGraph(sub, fakes, kind, index, name, part))
                graph.whole = SpmdGraph(gm, example_inputs, f"{name + ': ' if name else ''}graph {index} ({kind})",
                                        graph.compiled_segments)
                _REG.graphs.append(CompiledGraph(index, kind, ops, True, segments=graph.compiled_segments,
                                                 collectives=graph.collectives))
                return graph
            graph = JaxGraph(gm, example_inputs, kind, index, name)
        except MissingLowering as err:
            warnings.warn(f"tpusim: torch.compile graph {index} ({kind}) runs eagerly: no JAX lowering for "
                          f"{', '.join(err.ops)}", RuntimeWarning, stacklevel=2)
            _REG.graphs.append(CompiledGraph(index, kind, ops, False, tuple(err.ops)))
            return make_boxed_func(gm.forward)
        _REG.graphs.append(CompiledGraph(index, kind, ops, True))
        _dump(graph, index)
        if debug is not None:
            debug.add_executable(kind, graph)
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


@dataclass
class TpuCompileDebug:
    """What one torch.compile'd frame compiled to (TorchTPU's ``TpuCompileDebug``), handed to
    ``options={"debug_callback": f}`` at once and filled as its graphs compile."""

    pre_autograd_fx_code: list[str] = field(default_factory=list)
    pre_autograd_fx_readable: list[str] = field(default_factory=list)
    post_autograd_fx_forward_code: list[str] = field(default_factory=list)
    post_autograd_fx_forward_readable: list[str] = field(default_factory=list)
    post_autograd_fx_backward_code: list[str] = field(default_factory=list)
    post_autograd_fx_backward_readable: list[str] = field(default_factory=list)
    stablehlo_forward_text: list[str] = field(default_factory=list)
    stablehlo_backward_text: list[str] = field(default_factory=list)
    compiled_executables: list[object] = field(default_factory=list)

    def add_graph(self, kind: str, gm: torch.fx.GraphModule) -> None:
        part = "backward" if kind == "backward" else "forward"
        getattr(self, f"post_autograd_fx_{part}_code").append(gm.code)
        getattr(self, f"post_autograd_fx_{part}_readable").append(gm.print_readable(print_output=False))

    def add_executable(self, kind: str, graph: JaxGraph) -> None:
        part = "backward" if kind == "backward" else "forward"
        getattr(self, f"stablehlo_{part}_text").append(graph.lower().as_text())
        self.compiled_executables.append(graph)

    def __str__(self) -> str:
        sections = [(title, getattr(self, attr)) for title, attr in (
            ("Pre-Autograd FX Graph", "pre_autograd_fx_code"),
            ("Post-Autograd Forward FX Graph", "post_autograd_fx_forward_code"),
            ("Post-Autograd Backward FX Graph", "post_autograd_fx_backward_code"),
            ("StableHLO Forward", "stablehlo_forward_text"), ("StableHLO Backward", "stablehlo_backward_text"))]
        text = [f"=== {title} ===\n" + "\n".join(items).strip() for title, items in sections if items]
        return "\n\n".join(text) if text else "TpuCompileDebug(empty)"

    def __repr__(self) -> str:
        return (f"TpuCompileDebug(pre_fx={len(self.pre_autograd_fx_code)}, "
                f"post_fwd_fx={len(self.post_autograd_fx_forward_code)}, "
                f"post_bwd_fx={len(self.post_autograd_fx_backward_code)}, "
                f"stablehlo_fwd={len(self.stablehlo_forward_text)}, stablehlo_bwd={len(self.stablehlo_backward_text)}, "
                f"executables={len(self.compiled_executables)})")


# TorchTPU's torch.compile options (its compile/_backend.py and compile tests): name -> (what is accepted, check)
OPTIONS: dict[str, tuple[str, Callable[[object], bool]]] = {
    "debug_callback": ("a callable taking a TpuCompileDebug", callable),
    "name": ("text", lambda v: isinstance(v, str)),
    "async_compile": ("True or False", lambda v: isinstance(v, bool)),
    "serializable": ("True or False", lambda v: isinstance(v, bool)),
    "bounded_dynamism": ("True or False", lambda v: isinstance(v, bool)),
    "num_dynamic_buckets": ("a whole number 1..8", lambda v: isinstance(v, int) and not isinstance(v, bool)
                            and 1 <= v <= 8),
    "bucket_size": ("a whole number >= 1", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1),
    "tpu_backend": ("text", lambda v: isinstance(v, str)),
}


def _options(options: object) -> dict:
    """TorchTPU's ``options=`` checked: one TpusimError per unknown key or bad value."""
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise TpusimError(f"torch.compile(backend='tpu', options={options!r}): expected a dict; accepted keys: "
                          f"{', '.join(OPTIONS)}")
    for key, value in options.items():
        if key not in OPTIONS:
            raise TpusimError(f"torch.compile(backend='tpu'): unknown option {key!r}; accepted: {', '.join(OPTIONS)}")
        accepted, ok = OPTIONS[key]
        if not ok(value):
            raise TpusimError(f"torch.compile(backend='tpu'): option {key}={value!r}; accepted: {accepted}")
    return options


def tpu_backend(gm: torch.fx.GraphModule, example_inputs: list, **kwargs: object) -> Callable:
    """The Dynamo backend: AOT autograd with Core ATen decompositions, each graph lowered to JAX.
    ``kwargs``: torch.compile's ``options`` (TorchTPU's, see ``OPTIONS``) and ``mode`` (ignored)."""
    from torch._decomp import core_aten_decompositions  # Dynamo and AOT autograd: heavy, see above
    from torch._dynamo.backends.common import aot_autograd

    from tpusim.backend.aten.flash_attention import use_fused_attention  # defines ops: only once something compiles

    unknown = sorted(set(kwargs) - {"options", "mode"})
    if unknown:
        raise TpusimError(f"torch.compile(backend='tpu'): unexpected argument(s) {unknown}; accepted: options, mode")
    options = _options(kwargs.get("options"))
    name = str(options.get("name", ""))
    debug = None
    if "debug_callback" in options:
        debug = TpuCompileDebug(pre_autograd_fx_code=[gm.code],
                                pre_autograd_fx_readable=[gm.print_readable(print_output=False)])
        options["debug_callback"](debug)
    use_fused_attention(gm)     # SDPA as one fused op, not bmm + softmax + bmm (tpusim/backend/aten/flash_attention.py)
    return _noting_inference_mode(aot_autograd(
        fw_compiler=_compiler("forward", debug, name), bw_compiler=_compiler("backward", debug, name),
        inference_compiler=_compiler("inference", debug, name),
        decompositions=core_aten_decompositions())(gm, example_inputs))


def _noting_inference_mode(compiled: Callable) -> Callable:
    """``compiled``, noting the user's line when it runs under torch.inference_mode(): Dynamo compiles with the
    mode off and runs with it on, which works here and fails on TorchTPU (the lint's compile-inference-mode)."""
    @functools.wraps(compiled)
    def run(*args: object, **kwargs: object) -> object:
        if torch.is_inference_mode_enabled():
            _REG.inference_mode.setdefault(user_source())
        return compiled(*args, **kwargs)

    return run


def _on_tpu(gm: torch.fx.GraphModule, example_inputs: list) -> bool:
    """Whether a Dynamo graph computes on "tpu": an input, parameter or buffer of it lives there."""
    tensors = [t for t in example_inputs if isinstance(t, torch.Tensor)]
    tensors += list(gm.parameters()) + list(gm.buffers())
    return any(t.device.type == BACKEND for t in tensors)


def auto_backend(gm: torch.fx.GraphModule, example_inputs: list, **kwargs: object) -> Callable:
    """``torch.compile``'s default backend once tpusim is loaded: "tpu" for graphs on tpu, as TorchTPU's
    torch.compile does, else what the default was (Inductor), with torch.compile's mode and options."""
    if _on_tpu(gm, example_inputs):
        return tpu_backend(gm, example_inputs, **kwargs)
    previous = _REG.previous_default
    if previous == "inductor":
        return torch._TorchCompileInductorWrapper(kwargs.get("mode"), kwargs.get("options"), None)(gm, example_inputs)
    from torch._dynamo.backends.registry import lookup_backend  # Dynamo is loaded: it is calling us

    return lookup_backend(previous)(gm, example_inputs, **kwargs)


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
    default = registry.get_default_backend()
    if default is not auto_backend:
        _REG.previous_default = default
        registry.set_default_backend(auto_backend)


def _skip_tpusim(trace_rules: object) -> None:
    """Dynamo must never trace tpusim itself: the recorder's hooks run from inside ops (.item(), copies)
    while a frame is being compiled, and tracing them would add graph breaks of ours to the user's."""
    for package in ("tpusim", "tpusim.backend"):
        trace_rules.add(package)


def install() -> None:
    """Make ``backend="tpu"`` known to torch.compile, and the default for tpu graphs, when Dynamo is imported
    (it costs seconds, so not before), and report its graphs in every recording's meta
    (tpusim/backend/device/registration.py calls this)."""
    after_import("torch._dynamo.backends.registry", _register)
    after_import("torch._dynamo", lambda dynamo: _skip_tpusim(dynamo.trace_rules))
    recorder.add_meta_source(_trace_meta)
