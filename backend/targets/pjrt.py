"""The PJRT target (TPUSIM_TARGET=pjrt): tpu ops compute through JAX on JAX's default device.

``enable(mode)`` swaps the fallback's executor (``backend.fallback.executor``) for this one:
each op the fallback sees runs as a cached ``jax.jit`` computation of its lowering (or of its
Core ATen decomposition), on jax arrays made from the CPU views of the tpu storage.

Modes:

- **strict**: one jitted computation per op signature (op, input shapes/dtypes, non-tensor
  arguments), executed at once; the result is written back to the tensor's host memory.
- **fused**: ops are recorded into a window instead of run; the window is traced as one JAX
  function (one XLA program, fused by XLA) and executed when something needs a value: an op
  the table lacks, a random or hand-written op, a host read (``.cpu()``, ``.item()``, print:
  the shim's native copy hook), a read or write of a storage whose pending value is a different
  view, ``WINDOW_OPS`` ops, or ``flush()``. Windows compile once per signature (op sequence,
  shapes, wiring) like the fused kernels of tpusim.fusion.

**Synchronisation model** (honest version): host memory stays the source of truth. Every
executed computation copies its inputs from host memory into jax arrays and its outputs back
into host memory (on jax-CPU these are memcpys; on a TPU they are PCIe transfers, so this first
version measures dispatch and compile behaviour, not a TPU's steady-state speed). Views,
``.cpu()``, the native copy kernel and the sim-target fallback read host memory directly, so
in fused mode the window is flushed before them (the native hook, the executor) — collectives
and code reading storage through other routes should call ``flush()`` first. Random ops run on
the host generator so a seeded program draws exactly what CPU PyTorch draws. Ops returning
views, or mutating arguments other than ``self``/``out``, run on the host too.

Ops that cannot run through the table fall back to the host with one warning per op;
``host_ops()`` lists them.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

aten = torch.ops.aten
MODES = ("strict", "fused")
WINDOW_OPS = 256


@dataclass
class _OpInfo:
    """How one overload runs here, decided once."""

    kind: str                                     # "functional", "inplace", "out" or "host"
    functional: torch._ops.OpOverload | None = None
    why: str = ""


@dataclass
class Stats:
    ops: int = 0                  # ops executed through JAX
    host_ops: int = 0             # ops run on the host (CPU kernel)
    compiles: int = 0             # jitted computations built (per op signature, or per window)
    executions: int = 0           # jitted computations run
    flushes: dict[str, int] = field(default_factory=dict)


class _State:
    mode: str | None = None
    infos: dict[torch._ops.OpOverload, _OpInfo] = {}
    cache: dict[tuple, Callable | None] = {}      # signature -> jitted fn (None: run on host)
    host: dict[str, str] = {}                     # op name -> why it ran on the host
    stats = Stats()
    window: object = None


_S = _State()


# ---------------------------------------------------------------- classification


def _classify(op: torch._ops.OpOverload) -> _OpInfo:
    schema = op._schema
    writes = [a for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    if any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns):
        return _OpInfo("host", why="returns a view")
    if not writes:
        return _OpInfo("functional", op)
    from tpusim.backend.lowering.registry import functional_of

    functional = functional_of(op)
    if functional is None:
        return _OpInfo("host", why="no functional overload")
    if len(writes) == 1 and writes[0] is schema.arguments[0] and not writes[0].kwarg_only \
            and str(writes[0].type) == "Tensor":
        return _OpInfo("inplace", functional)
    if all(a.kwarg_only for a in writes) and len(schema.returns) == len(writes):
        return _OpInfo("out", functional)
    return _OpInfo("host", why="mutates arguments other than self/out")


def _info(op: torch._ops.OpOverload) -> _OpInfo:
    info = _S.infos.get(op)
    if info is None:
        info = _S.infos[op] = _classify(op)
    return info


# ---------------------------------------------------------------- building jitted computations


def _sig(v: object) -> object:
    if isinstance(v, torch.Tensor):
        return ("T", tuple(v.shape), v.dtype)
    if isinstance(v, (list, tuple)):
        return tuple(_sig(x) for x in v)
    if isinstance(v, float) and v != v:
        return "nan"
    return v if isinstance(v, (int, float, bool, str, type(None), torch.dtype, complex)) else repr(v)


def _split(args: tuple, kwargs: dict) -> tuple[list[torch.Tensor], Callable]:
    """Tensors of (args, kwargs), and a function putting replacements back."""
    import torch.utils._pytree as pytree

    leaves, spec = pytree.tree_flatten((args, kwargs))
    idx = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]

    def rebuild(tensors: list) -> tuple[tuple, dict]:
        vals = list(leaves)
        for i, t in zip(idx, tensors):
            vals[i] = t
        a, k = pytree.tree_unflatten(vals, spec)
        return a, k

    return [leaves[i] for i in idx], rebuild


def _lowered(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Callable | None:
    """``f(*jax tensors) -> result`` for one op call, from the table or from its decomposition."""
    from tpusim.backend.lowering import lookup

    tensors, rebuild = _split(args, kwargs)
    entry = lookup(op)
    if entry is not None:
        if not entry.jit:
            return None

        def direct(*arrays: object) -> object:
            a, k = rebuild(list(arrays))
            return entry.fn(*a, **k)

        return direct
    from torch._decomp import core_aten_decompositions
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from tpusim.backend.lowering import MissingLowering, jax_function

    def call(*ts: torch.Tensor) -> object:
        a, k = rebuild(list(ts))
        return op(*a, **k)

    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fakes = [mode.from_tensor(t) for t in tensors]
        gm = make_fx(call, decomposition_table=core_aten_decompositions(), tracing_mode="fake")(*fakes)
    if any(n.op == "call_function" and n.target is op for n in gm.graph.nodes):
        return None                                          # no decomposition: it traced to itself
    try:
        fn = jax_function(gm)
    except MissingLowering:
        return None
    single = not isinstance(_meta_result(op, args, kwargs), (tuple, list))

    def decomposed(*arrays: object) -> object:
        out = fn(*arrays)
        return out[0] if single else out

    return decomposed


def _meta(t: object) -> object:
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta") if isinstance(t, torch.Tensor) else t


def _meta_result(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> object:
    import torch.utils._pytree as pytree

    return op(*pytree.tree_map(_meta, args), **pytree.tree_map(_meta, kwargs))


def _agrees(fn: Callable, op: torch._ops.OpOverload, args: tuple, kwargs: dict, tensors: list) -> bool:
    """The lowering's output shapes and dtypes equal PyTorch's own (meta kernel): checked once per signature."""
    import jax
    import torch.utils._pytree as pytree
    from tpusim.backend.lowering.dtypes import jax_dtype, torch_dtype

    try:
        expected = _meta_result(op, args, kwargs)
    except Exception:  # noqa: BLE001  (no meta kernel: trust the lowering)
        return True
    specs = [jax.ShapeDtypeStruct(tuple(t.shape), jax_dtype(t.dtype)) for t in tensors]
    got = jax.eval_shape(fn, *specs)
    exp = [t for t in pytree.tree_leaves(expected) if isinstance(t, torch.Tensor)]
    out = [g for g in pytree.tree_leaves(got) if hasattr(g, "shape")]
    return len(exp) == len(out) and all(tuple(e.shape) == tuple(g.shape) and e.dtype == torch_dtype(g.dtype)
                                        for e, g in zip(exp, out))


def _compiled(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Callable | None:
    key = (op, _sig(args), _sig(kwargs))
    try:
        return _S.cache[key]
    except KeyError:
        pass
    import jax

    fn = None
    try:
        lowered = _lowered(op, args, kwargs)
        if lowered is not None and _agrees(lowered, op, args, kwargs, _split(args, kwargs)[0]):
            fn = jax.jit(lowered)
            _S.stats.compiles += 1
    except Exception as err:  # noqa: BLE001  (any failure to lower: run this signature on the host)
        _note_host(op, f"lowering failed: {type(err).__name__}: {str(err).splitlines()[0][:120]}")
    _S.cache[key] = fn
    return fn


# ---------------------------------------------------------------- host <-> jax


def _to_jax(t: torch.Tensor) -> object:
    from tpusim.backend.lowering import tensor_to_jax

    return tensor_to_jax(t)


def _to_torch(a: object) -> torch.Tensor:
    import numpy as np

    host = np.asarray(a)
    if host.dtype.name == "bfloat16":
        return torch.from_numpy(host.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(host.copy() if not host.flags.writeable or host.base is not None else host)


def _note_host(op: torch._ops.OpOverload, why: str) -> None:
    name = str(op)
    if name not in _S.host:
        _S.host[name] = why
        warnings.warn(f"tpusim pjrt: {name} runs on the host (CPU kernel): {why}", RuntimeWarning, stacklevel=4)


def _write(dst: torch.Tensor, value: torch.Tensor) -> None:
    if dst.shape != value.shape:
        dst.resize_(value.shape)
    dst.copy_(value)


# ---------------------------------------------------------------- the executor


def execute(op: torch._ops.OpOverload, plan: object, hargs: list, hkwargs: dict) -> object:
    """``backend.fallback.executor`` on the PJRT target (see the module docstring)."""
    from tpusim.backend.state import STATE

    if not STATE.numerics or plan.random or plan.kernel is not None:
        return _host(op, plan, hargs, hkwargs)
    info = _info(op)
    if op is aten.native_batch_norm.default and hargs[5] and hargs[3] is not None:
        info = _OpInfo("host", why="updates running statistics in place (an unannotated mutation)")
    if info.kind == "host":
        _note_host(op, info.why)
        return _host(op, plan, hargs, hkwargs)
    if info.kind == "out":
        outs = {k: v for k, v in hkwargs.items() if k not in _functional_kwargs(info.functional)}
        fkwargs = {k: v for k, v in hkwargs.items() if k not in outs}
        args = tuple(hargs)
    else:
        outs, args, fkwargs = {}, tuple(hargs), hkwargs
    fn = _compiled(info.functional, args, fkwargs)
    if fn is None:
        _note_host(info.functional, "not in the lowering table and no Core ATen decomposition lowers")
        return _host(op, plan, hargs, hkwargs)
    window = _S.window
    if window is not None:
        return window.add(op, info, fn, args, fkwargs, outs)
    tensors, _ = _split(args, fkwargs)
    result = fn(*[_to_jax(t) for t in tensors])
    _S.stats.ops += 1
    _S.stats.executions += 1
    return _finish(info, hargs, outs, result)


def _functional_kwargs(op: torch._ops.OpOverload) -> set[str]:
    return {a.name for a in op._schema.arguments}


def _finish(info: _OpInfo, hargs: list, outs: dict, result: object) -> object:
    """Map jax results onto what the overload returns: fresh tensors, self, or the out= tensors."""
    if info.kind == "inplace":
        _write(hargs[0], _to_torch(result))
        return hargs[0]
    if isinstance(result, (tuple, list)):
        values = [_to_torch(r) if r is not None and hasattr(r, "shape") else r for r in result]
    else:
        values = _to_torch(result) if hasattr(result, "shape") else result
    if info.kind == "out":
        dsts = list(outs.values())
        vals = values if isinstance(values, list) else [values]
        for d, v in zip(dsts, vals):
            _write(d, v)
        return dsts[0] if len(dsts) == 1 else tuple(dsts)
    return tuple(values) if isinstance(values, list) else values


def _host(op: torch._ops.OpOverload, plan: object, hargs: list, hkwargs: dict) -> object:
    from tpusim.backend.fallback import _cpu

    if _S.window is not None:
        _S.window.flush("host op")
    _S.stats.host_ops += 1
    return _cpu(op, plan, hargs, hkwargs)


# ---------------------------------------------------------------- switching


def enable(mode: str = "strict") -> None:
    """Run tpu ops through JAX from now on (``mode``: "strict" or "fused")."""
    from tpusim.backend import fallback

    if mode not in MODES:
        raise ValueError(f"tpusim pjrt: mode {mode!r}; accepted: {', '.join(MODES)} (TPUSIM_PJRT_MODE)")
    import tpusim.backend.lowering  # noqa: F401  (fills the table, turns on jax x64)

    disable()
    _S.mode = mode
    if mode == "fused":
        from tpusim.backend.targets.pjrt_fused import Window

        _S.window = Window(_S.stats, WINDOW_OPS)
        _S.window.install()
    fallback.executor = execute


def disable() -> None:
    """Back to the sim target (CPU kernels), flushing pending work first."""
    from tpusim.backend import fallback

    if _S.window is not None:
        _S.window.flush("disable")
        _S.window.uninstall()
        _S.window = None
    _S.mode = None
    fallback.executor = fallback._cpu


def flush() -> None:
    """Execute pending fused work (no-op in strict mode)."""
    if _S.window is not None:
        _S.window.flush("flush")


def mode() -> str | None:
    return _S.mode


def host_ops() -> dict[str, str]:
    """Ops that ran on the host instead of JAX, with why."""
    return dict(_S.host)


def stats() -> Stats:
    return _S.stats


def reset_stats() -> None:
    _S.stats = Stats()
    if _S.window is not None:
        _S.window.stats = _S.stats


def from_env() -> None:
    """Enable the target when TPUSIM_TARGET=pjrt (mode from TPUSIM_PJRT_MODE, default strict)."""
    if os.environ.get("TPUSIM_TARGET", "sim").strip().lower() == "pjrt":
        enable(os.environ.get("TPUSIM_PJRT_MODE", "strict").strip().lower() or "strict")
