"""torch_tpu's JAX bridge (``torch_tpu._internal.pallas``): a JAX function, Pallas kernels included, as one torch op.

    def add_jax(x: jax.Array, y: jax.Array) -> jax.Array:
        return pl.pallas_call(add_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x, y)

    add = jax_op("pallas::add", add_jax)        # a torch.library CustomOpDef: register_fake, register_autograd
    z = add(x, y)                                # x, y on "tpu": z on "tpu"

What TorchTPU does: it exports the JAX function to StableHLO and splices it into its own program, typing the
torch schema from the function's annotations (``jax.Array`` parameters are tensors; the return annotation,
``jax.Array`` or ``tuple[jax.Array, ...]``, says how many tensors come back). What tpusim does with the same
function: the op is a ``torch.library`` custom op in the name given, whose CPU kernel runs the function with
JAX on the host, on the tensors' values (tpusim's device runs it on the device memory's host view, as every
op), so the result equals the JAX function on CPU exactly. ``pl.pallas_call`` kernels run in Pallas' TPU
interpret mode (JAX's CPU has no Mosaic); a kernel that cannot be interpreted raises a ``TpusimError``.
The op is one record of the trace, priced as one opaque kernel of its tensors' bytes (``add_kernel`` in
tpusim/trace/ops.py: never fused, 1 FLOP per output element: Pallas kernels are opaque to the cost model).
Its fake (shape) function comes from ``jax.eval_shape``, and the op's lowering is the function itself, so a
torch.compile'd graph that calls it lowers whole (tpusim/backend/lowering/).

Differences: JAX runs with 64-bit types on (tpusim's lowering turns them on for PyTorch's int64 and float64),
so a function that makes arrays without a dtype gets 64-bit ones where TorchTPU's process would get 32-bit;
``donate_argnums`` is accepted and changes nothing (no input is consumed); ``mesh`` (a sharded JAX op over
TPU devices) raises, since the function runs on one host CPU.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import typing
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from tpusim.errors import TpusimError
from tpusim.trace import ops as op_table

TENSOR, OPTIONAL_TENSOR, TENSOR_LIST = "Tensor", "Tensor?", "Tensor[]"
_SCALARS = {int: "int", float: "float", bool: "bool", str: "str"}


# ---------------------------------------------------------------- the torch schema from the JAX signature


def _jax_array_types() -> tuple[type, ...]:
    import jax
    import numpy as np

    return jax.Array, np.ndarray, torch.Tensor


def _is_array(annotation: object) -> bool:
    return annotation is inspect.Parameter.empty or (isinstance(annotation, type)
                                                     and issubclass(annotation, _jax_array_types()))


def _parameter_type(name: str, annotation: object) -> str:
    """A parameter's torch schema type from its annotation (unannotated: a tensor)."""
    if _is_array(annotation):
        return TENSOR
    if annotation in _SCALARS:
        return _SCALARS[annotation]
    args = typing.get_args(annotation)
    if type(None) in args and len(args) == 2 and _is_array(next(a for a in args if a is not type(None))):
        return OPTIONAL_TENSOR
    if typing.get_origin(annotation) in (list, Sequence, tuple) and args and _is_array(args[0]):
        return TENSOR_LIST
    raise TpusimError(f"jax_op: parameter {name!r} is annotated {annotation!r}; accepted: jax.Array, "
                      f"jax.Array | None, list[jax.Array], int, float, bool, str")


def _return_types(where: str, annotation: object) -> tuple[str, ...] | str:
    """The returns: one tensor ("Tensor"), a tensor list ("Tensor[]") or a fixed tuple of tensors."""
    if annotation is inspect.Signature.empty:
        raise TpusimError(f"{where}: the function needs a return annotation (jax.Array, or tuple[jax.Array, ...] "
                          f"for several results): the torch schema is read from it, as TorchTPU does")
    if _is_array(annotation):
        return TENSOR
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is tuple and args and args[-1] is not Ellipsis and all(_is_array(a) for a in args):
        return tuple(TENSOR for _ in args)
    if origin in (list, tuple, Sequence) and args and _is_array(args[0]):
        return TENSOR_LIST
    raise TpusimError(f"{where}: return annotation {annotation!r}; accepted: jax.Array, tuple[jax.Array, ...], "
                      f"list[jax.Array]")


def _signature(fn: Callable) -> inspect.Signature:
    """``fn``'s signature with its annotations evaluated: in its module, else with ``jax``, ``jnp``, ``np``
    and typing's names at hand (a function defined in another function under ``from __future__ import
    annotations`` names them as text its module cannot resolve)."""
    import jax
    import numpy as np

    known = {"jax": jax, "jnp": jax.numpy, "np": np, **{n: getattr(typing, n) for n in ("Tuple", "List",
                                                                                          "Optional", "Sequence")}}
    for scope in ({}, known):
        try:
            return inspect.signature(fn, eval_str=True, locals=scope)
        except (NameError, TypeError, AttributeError, SyntaxError):
            continue
    return inspect.signature(fn)


def schema_of(name: str, fn: Callable) -> str:
    """The torch schema of ``fn`` as TorchTPU types it: "(Tensor x, Tensor y) -> Tensor"."""
    where = f"jax_op({name!r})"
    sig = _signature(fn)
    parts, keyword_only = [], False
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TpusimError(f"{where}: *{p.name} carries no count of tensors; spell the parameters out "
                              f"(or set fn.__signature__)")
        if p.kind == p.KEYWORD_ONLY and not keyword_only:
            parts.append("*")
            keyword_only = True
        kind = _parameter_type(p.name, p.annotation)
        default = "" if p.default is p.empty else f"={_default(where, p.default)}"
        parts.append(f"{kind} {p.name}{default}")
    returns = _return_types(where, sig.return_annotation)
    out = returns if isinstance(returns, str) else f"({', '.join(returns)})"
    return f"({', '.join(parts)}) -> {out}"


def _default(where: str, value: object) -> str:
    if value is None or isinstance(value, bool | int | float):
        return repr(value) if value is not None else "None"
    if isinstance(value, str):
        return f'"{value}"'
    raise TpusimError(f"{where}: default {value!r} cannot be written in a torch schema")


# ---------------------------------------------------------------- running the function on the host


@contextlib.contextmanager
def pallas_interpreted() -> Iterator[None]:
    """Pallas kernels traced in the block run in TPU interpret mode (JAX's CPU has no Mosaic compiler)."""
    try:
        from jax.experimental.pallas import tpu as pltpu

        force = pltpu.force_tpu_interpret_mode
    except (ImportError, AttributeError):   # an older JAX: kernels must say interpret=True themselves
        yield
        return
    with force():
        yield


def _host_error(name: str, error: Exception) -> TpusimError:
    why = str(error).splitlines()[0] if str(error) else type(error).__name__
    if "interpret mode" in why.lower():
        return TpusimError(f"jax_op {name!r}: its Pallas kernel cannot run on the host ({why}); tpusim runs kernels "
                           f"in Pallas' TPU interpret mode, which this JAX lacks: pass interpret=True to "
                           f"pl.pallas_call, or upgrade jax")
    return TpusimError(f"jax_op {name!r}: the JAX function failed on the host CPU: {why}")


@dataclass
class JaxKernel:
    """One JAX function called with torch tensors: tensors become jax arrays (the rest stays static) and the
    results torch tensors, ``results`` of them (1: one tensor; "list": a list)."""

    name: str
    fn: Callable
    results: int | str

    def __post_init__(self) -> None:
        self._jitted: dict[tuple, Callable] = {}

    def _split(self, args: tuple, kwargs: dict) -> tuple[list[torch.Tensor], Callable[[list], object], tuple]:
        """The tensors among the arguments, a function calling ``fn`` with arrays in their place, and the
        static rest (the jit cache's key)."""
        sig = _signature(self.fn)
        bound = sig.bind(*args, **kwargs)
        tensors: list[torch.Tensor] = []
        layout: list[tuple[str, object]] = []
        for key, value in bound.arguments.items():
            if isinstance(value, torch.Tensor):
                layout.append((key, len(tensors)))
                tensors.append(value)
            elif isinstance(value, list | tuple) and value and all(isinstance(v, torch.Tensor) for v in value):
                layout.append((key, slice(len(tensors), len(tensors) + len(value))))
                tensors += value
            else:
                layout.append((key, ("static", value)))

        def call(arrays: list) -> object:
            values = {}
            for key, where in layout:
                if isinstance(where, tuple):
                    values[key] = where[1]
                else:
                    values[key] = list(arrays[where]) if isinstance(where, slice) else arrays[where]
            again = sig.bind_partial()
            again.arguments.update(values)
            return self.fn(*again.args, **again.kwargs)

        static = tuple((key, repr(where)) for key, where in layout)
        return tensors, call, static

    def run(self, *args: object, **kwargs: object) -> object:
        """The function on the host: CPU tensors in (the device memory's host view on tpu), CPU tensors out."""
        import jax

        from tpusim.backend.lowering import jax_to_tensor, tensor_to_numpy

        tensors, call, static = self._split(args, kwargs)
        jitted = self._jitted.get(static)
        if jitted is None:
            jitted = self._jitted[static] = jax.jit(lambda *arrays: call(list(arrays)))
        try:
            with pallas_interpreted():
                out = jitted(*[tensor_to_numpy(t) for t in tensors])
        except Exception as error:  # noqa: BLE001  (whatever the user's JAX function raised, said in words)
            raise _host_error(self.name, error) from error
        leaves = self._leaves(out)
        results = [jax_to_tensor(a) for a in leaves]
        return results[0] if self.results == 1 else results if self.results == "list" else tuple(results)

    def _leaves(self, out: object) -> list:
        leaves = list(out) if isinstance(out, list | tuple) else [out]
        if self.results != "list" and self.results != len(leaves):
            raise TpusimError(f"jax_op {self.name!r}: the function returned {len(leaves)} arrays; its return "
                              f"annotation says {self.results}")
        return leaves

    def fake(self, *args: object, **kwargs: object) -> object:
        """The results' shapes and dtypes (``jax.eval_shape``) as empty tensors on the inputs' device."""
        import jax

        from tpusim.backend.lowering.dtypes import jax_dtype, torch_dtype

        tensors, call, _ = self._split(args, kwargs)
        specs = [jax.ShapeDtypeStruct(tuple(int(s) for s in t.shape), jax_dtype(t.dtype)) for t in tensors]
        device = tensors[0].device if tensors else torch.device("cpu")
        with pallas_interpreted():
            out = jax.eval_shape(lambda *arrays: call(list(arrays)), *specs)
        empties = [torch.empty(tuple(s.shape), dtype=torch_dtype(s.dtype), device=device) for s in self._leaves(out)]
        return empties[0] if self.results == 1 else empties if self.results == "list" else tuple(empties)

    def lowering(self, *args: object, **kwargs: object) -> object:
        """The op inside a torch.compile'd graph: the function itself, traced with the graph's arrays."""
        with pallas_interpreted():
            return self.fn(*args, **kwargs)


# ---------------------------------------------------------------- jax_op: the op


def _results_of(schema: str) -> int | str:
    out = schema.rsplit("->", 1)[1].strip()
    if out == TENSOR:
        return 1
    if out == TENSOR_LIST:
        return "list"
    return out.count(TENSOR)


def define(name: str, fn: Callable, schema: str) -> torch.library.CustomOpDef:
    """``fn`` as the custom op ``name`` (namespace::op) with ``schema``: run on the host, faked by
    ``jax.eval_shape``, lowered as itself, priced as one opaque kernel."""
    if name.count("::") != 1 or not all(name.split("::")):
        raise TpusimError(f"jax_op: name {name!r} must be 'namespace::op_name', as torch.library names ops")
    kernel = JaxKernel(name, fn, _results_of(schema))
    try:
        op = torch.library.custom_op(name, kernel.run, mutates_args=(), device_types="cpu", schema=schema)
    except RuntimeError as error:
        raise TpusimError(f"jax_op {name!r}: torch.library refused it: {str(error).splitlines()[0]} (an op "
                          f"of this name exists: pick another name)") from error
    op.register_fake(kernel.fake)
    op_table.add_kernel(name)
    from tpusim.backend.lowering import register

    namespace, op_name = name.split("::")
    register(getattr(getattr(torch.ops, namespace), op_name).default)(kernel.lowering)
    return op


def jax_op(name: str, fn: Callable | None = None, /, *, donate_argnums: Sequence[int] = (), mesh: object = None,
           input_partition_specs: object = None,
           output_partition_specs: object = None) -> torch.library.CustomOpDef | Callable[[Callable], object]:
    """TorchTPU's ``jax_op``: the JAX function ``fn`` as the torch custom op ``name`` ("namespace::op"),
    typed from its annotations (see the module docstring); without ``fn``, a decorator."""
    if fn is None:
        return functools.partial(jax_op, name, donate_argnums=donate_argnums, mesh=mesh,
                                 input_partition_specs=input_partition_specs,
                                 output_partition_specs=output_partition_specs)
    if mesh is not None or input_partition_specs is not None or output_partition_specs is not None:
        raise TpusimError(f"jax_op {name!r}: mesh and partition specs shard the function over TPU devices "
                          f"with shard_map; tpusim runs a jax_op on one host CPU (call it per rank instead)")
    return define(name, fn, schema_of(name, fn))


# ---------------------------------------------------------------- custom_jax_kernel / custom_kernel: untyped forms


class JaxCallable:
    """TorchTPU's ``custom_jax_kernel`` result: call with torch tensors (and the static arguments at
    ``static_argnums``); each distinct static signature is one custom op, typed at its first call."""

    def __init__(self, fn: Callable, name: str, static_argnums: Sequence[int] = ()) -> None:
        self.fn, self.name, self.static_argnums = fn, name, tuple(static_argnums)
        self._ops: dict[tuple, tuple[torch.library.CustomOpDef, object]] = {}

    def __repr__(self) -> str:
        return f"JaxCallable(name={self.name}, static_argnums={self.static_argnums})"

    def __call__(self, *args: object) -> object:
        import jax

        from tpusim.backend.lowering.dtypes import jax_dtype

        static = {i: a for i, a in enumerate(args) if i in self.static_argnums}
        if any(isinstance(a, torch.Tensor) for a in static.values()):
            raise TpusimError(f"{self.name}: a tensor cannot be a static argument (static_argnums)")
        dynamic = [a for i, a in enumerate(args) if i not in static]
        bad = [type(a).__name__ for a in dynamic if a is not None and not isinstance(a, torch.Tensor)]
        if bad:
            raise TpusimError(f"{self.name}: custom kernels take tensors and None; got {', '.join(bad)} (use "
                              f"static_argnums or functools.partial for the others)")
        key = (tuple(sorted((i, repr(a)) for i, a in static.items())),
               tuple(None if a is None else (tuple(a.shape), a.dtype) for a in dynamic))
        found = self._ops.get(key)
        if found is None:
            def bound(*arrays: object) -> object:
                it = iter(arrays)
                return self.fn(*[static[i] if i in static else next(it) for i in range(len(args))])

            specs = [jax.ShapeDtypeStruct(tuple(a.shape), jax_dtype(a.dtype)) for a in dynamic if a is not None]
            present = [a is not None for a in dynamic]

            def on_arrays(*arrays: object) -> object:
                it = iter(arrays)
                return bound(*[next(it) if p else None for p in present])

            with pallas_interpreted():
                shape = jax.eval_shape(on_arrays, *specs)
            leaves, tree = jax.tree_util.tree_flatten(shape)
            params = ", ".join(f"Tensor x{i}" for i in range(len(specs)))
            out = TENSOR if len(leaves) == 1 else f"({', '.join(TENSOR for _ in leaves)})"
            label = f"torch_tpu_jax::{_identifier(self.name)}_{id(self.fn):x}_{len(self._ops)}"
            found = self._ops[key] = (define(label, on_arrays, f"({params}) -> {out}"), tree)
        op, tree = found
        result = op(*[a for a in dynamic if a is not None])
        leaves = [result] if isinstance(result, torch.Tensor) else list(result)
        return jax.tree_util.tree_unflatten(tree, leaves)


def _identifier(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text) or "kernel"


def custom_jax_kernel(jax_fn: Callable | None = None, name: str | None = None, static_argnums: Sequence[int] = (),
                      input_output_aliases: object = None, **jit_kwargs: object) -> JaxCallable | Callable:
    """TorchTPU's ``custom_jax_kernel``: a JAX function (a kernel library's wrapper) callable on torch tensors,
    typed at its first call (no annotations needed); ``input_output_aliases`` and jit options change nothing."""
    if jax_fn is None:
        return functools.partial(custom_jax_kernel, name=name, static_argnums=static_argnums,
                                 input_output_aliases=input_output_aliases, **jit_kwargs)
    return JaxCallable(jax_fn, name or getattr(jax_fn, "__name__", "kernel"), static_argnums)


def custom_kernel(output_shapes: object, pallas_kernel: Callable | None = None, **pl_kwargs: object) -> Callable:
    """TorchTPU's ``custom_kernel``: a Pallas kernel (refs in, refs out) callable on torch tensors; ``output_shapes``
    are tensors (or a function of the inputs giving them) whose shapes and dtypes the outputs take."""

    def decorator(kernel: Callable) -> Callable:
        cache: dict[tuple, JaxCallable] = {}

        @functools.wraps(kernel)
        def call(*args: torch.Tensor) -> object:
            import jax
            from jax.experimental import pallas as pl

            from tpusim.backend.lowering.dtypes import jax_dtype

            shapes = output_shapes(*args) if callable(output_shapes) else output_shapes
            flat = [shapes] if isinstance(shapes, torch.Tensor) else list(shapes)
            specs = [jax.ShapeDtypeStruct(tuple(t.shape), jax_dtype(t.dtype)) for t in flat]
            key = tuple((tuple(s.shape), str(s.dtype)) for s in specs)
            if key not in cache:
                out_shape = specs[0] if isinstance(shapes, torch.Tensor) else specs
                cache[key] = JaxCallable(lambda *xs: pl.pallas_call(kernel, out_shape=out_shape, **pl_kwargs)(*xs),
                                         str(pl_kwargs.get("name") or getattr(kernel, "__name__", "kernel")))
            return cache[key](*args)

        return call

    return decorator if pallas_kernel is None else decorator(pallas_kernel)


__all__ = ["JaxCallable", "custom_jax_kernel", "custom_kernel", "define", "jax_op", "pallas_interpreted",
           "schema_of"]
