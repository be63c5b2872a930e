"""Each distinct eager op of a recording as a one-op program for the TPU compiler (tpusim/xla/).

In Strict and Debug every eager op is its own XLA executable on a TPU. With the device config's
``op_programs`` on (``DeviceConfig.op_programs``: ``tpusim run`` sets it when the compiler prices the run, a plain
script with ``TPUSIM_XLA_OPS=1``), every op's cost is asked at the op with its
arguments (``asked_at_op``): the shim asks once per distinct call, and ``note`` keeps the first call of each
signature (``tpusim.trace.records.op_signature``: name, shapes, dtypes). When the recording stops,
``lowered`` turns each into StableHLO for TPU through the lowering table: a one-node FX graph of the op
with its tensors as inputs. An op the table cannot lower keeps the reason; the model prices it.
"""

from __future__ import annotations

import torch
import torch.fx

from tpusim.backend.plumbing.state import STATE
from tpusim.backend.program_trace.costs import reads_arguments
from tpusim.trace.records import XlaModule, op_signature


def enabled() -> bool:
    """Whether eager ops are recorded for the TPU compiler: the device config in effect says so."""
    return bool(STATE.config is not None and STATE.config.op_programs)


def asked_at_op(name: str) -> bool:
    """Whether the shim asks an op's cost with its arguments: its cost rule reads them, or the compiler
    wants each op's program (``enabled``)."""
    return reads_arguments(name) or (enabled() and name.startswith("aten::"))


def _spec(t: torch.Tensor) -> tuple[tuple[int, ...], str]:
    return tuple(int(s) for s in t.shape), str(t.dtype).removeprefix("torch.")


def signature(name: str, inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> str:
    return op_signature(name, map(_spec, inputs), (_spec(t) for t in outputs if t is not None))


def note(seen: dict[str, tuple[str, tuple]], name: str, inputs: list[torch.Tensor], outputs: list[torch.Tensor],
         args: tuple) -> None:
    """Keep the first call of this op's signature (name, and its arguments with the tensors as meta tensors: a
    kept tpu tensor would never be freed, and the recording would say so) in ``seen``."""
    key = signature(name, inputs, outputs)
    if key not in seen:
        seen[key] = (name, tuple(_on_meta(list(args))))


def _split(op: torch._ops.OpOverload, args: tuple) -> tuple[tuple, dict]:
    """``args`` in schema order (as the shim passes them) as the positional and keyword arguments of ``op``."""
    schema = op._schema.arguments
    positional = sum(1 for a in schema if not a.kwarg_only)
    keywords = [a.name for a in schema if a.kwarg_only]
    return tuple(args[:positional]), dict(zip(keywords, args[positional:]))


def _on_meta(value: object) -> object:
    if isinstance(value, torch.Tensor):
        return torch.empty(value.shape, dtype=value.dtype, device="meta")
    if isinstance(value, list | tuple):
        return type(value)(_on_meta(v) for v in value)
    return value


def _overload(name: str, args: tuple, key: str) -> torch._ops.OpOverload:
    """The overload of ``name`` (recorded without one, "aten::add") that takes ``args`` and gives the
    signature's results: each is tried on meta tensors, "default" and "Tensor" first."""
    namespace, _, rest = name.partition("::")
    base, _, given = rest.partition(".")
    packet = getattr(getattr(torch.ops, namespace), base)
    names = [given] if given else sorted(packet.overloads(), key=lambda n: (n not in ("default", "Tensor"), n))
    for overload in names:
        op = getattr(packet, overload)
        positional, keywords = _split(op, args)
        if _int_for_enum(op, positional, keywords):
            continue
        try:
            out = op(*_on_meta(positional), **_on_meta(keywords))
        except Exception:  # not this overload's arguments
            continue
        results = [t for t in (out if isinstance(out, list | tuple) else [out]) if isinstance(t, torch.Tensor)]
        if signature(name, [t for t in _flat(args) if isinstance(t, torch.Tensor)], results) == key:
            return op
    raise ValueError(f"no overload of {name} takes the recorded arguments")


_ENUMS = ("ScalarType", "Layout", "MemoryFormat")   # the shim hands these as torch.dtype, layout, memory_format


def _int_for_enum(op: torch._ops.OpOverload, positional: tuple, keywords: dict) -> bool:
    """Whether a plain int would land on a dtype, layout or memory-format parameter: it is another overload's
    argument (arange's ``end`` read as arange.default's ``dtype``), and torch reads an enum that large out of
    bounds: a segfault, not an exception to catch."""
    given = {**dict(zip((a.name for a in op._schema.arguments), positional)), **keywords}
    return any(isinstance(given.get(a.name), int) and not isinstance(given.get(a.name), bool)
               and any(enum in str(a.real_type) for enum in _ENUMS) for a in op._schema.arguments)


def _flat(value: object) -> list:
    if isinstance(value, list | tuple):
        return [x for v in value for x in _flat(v)]
    return [value]


def _graph(op: torch._ops.OpOverload, args: tuple) -> tuple[torch.fx.GraphModule, list[torch.Tensor]]:
    """``op`` applied to ``args`` as a one-node FX graph whose inputs are the tensors among them."""
    graph = torch.fx.Graph()
    tensors: list[torch.Tensor] = []

    def placeholder(value: object) -> object:
        if isinstance(value, torch.Tensor):
            tensors.append(value)
            return graph.placeholder(f"t{len(tensors)}")
        if isinstance(value, list | tuple):
            return type(value)(placeholder(v) for v in value)
        return value

    positional, keywords = _split(op, args)
    node = graph.call_function(op, tuple(placeholder(v) for v in positional),
                               {k: placeholder(v) for k, v in keywords.items()})
    graph.output(node)
    return torch.fx.GraphModule(torch.nn.Module(), graph), tensors


def lowered(key: str, name: str, args: tuple) -> XlaModule:
    """The op's one-op program as StableHLO for TPU, labelled by its signature, or why it has none."""
    try:
        import jax  # the lowering table needs jax (a dependency); imported here, as torch_compile/ does

        from tpusim.backend.lowering import jax_function
        from tpusim.backend.lowering.dtypes import jax_dtype
        from tpusim.backend.lowering.interpreter import needs_random

        gm, tensors = _graph(_overload(name, args, key), args)
        specs = [jax.ShapeDtypeStruct(tuple(int(s) for s in t.shape), jax_dtype(t.dtype)) for t in tensors]
        if needs_random(gm):
            specs.append(jax.ShapeDtypeStruct((2,), "uint32"))
        text = jax.jit(jax_function(gm)).trace(*specs).lower(lowering_platforms=("tpu",)).as_text()
        return XlaModule(key, text)
    except Exception as error:  # an op the lowering table lacks, or cannot lower alone: the model prices it
        return XlaModule(key, error=f"lowering for TPU failed: {error}"[:300])
