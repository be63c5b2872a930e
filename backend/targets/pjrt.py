"""The PJRT target (TPUSIM_TARGET=pjrt): tpu ops compute through JAX on JAX's default device.

``enable()`` (called at import when TPUSIM_TARGET=pjrt) swaps the fallback's executor
(``backend.fallback.executor``) for this one: each op the fallback sees runs as a cached
``jax.jit`` computation of its lowering (or of its Core ATen decomposition), on jax arrays made
from the CPU views of the tpu storage.

**Modes follow the eager mode** (tpusim/eager.py: ``tpusim.set_eager_mode``, ``eager_mode``,
``TPUSIM_EAGER_MODE``; there is no mode of the target's own). ``enable(name)`` sets the eager
mode; a change at run time switches the execution here, running pending work first (cut ``mode``):

- **strict**: one jitted computation per op signature (op, input shapes/dtypes, non-tensor
  arguments), executed at once; the result is written back to the tensor's host memory.
- **debug**: as strict, so every result is in memory when the device's debug check
  (backend/debug.py: NaN/Inf at the op) reads it after the executor.
- **fused**: the windows of tpusim.fusion's Fused model, each traced into one jitted program
  (one XLA program, fused by XLA) and run at a cut: pjrt_fused.py, which also lists the cuts.
  Windows compile once per signature (op sequence, shapes, wiring), like the simulator's.

**Synchronisation model** (honest version): host memory stays the source of truth. Every
executed computation copies its inputs from host memory into jax arrays and its outputs back
into host memory (on jax-CPU these are memcpys; on a TPU they are PCIe transfers, so this first
version measures dispatch and compile behaviour, not a TPU's steady-state speed). Everything
else that reads device memory through host aliases runs after a cut: the shim's native
item/copy, collectives of the tpusim c10d backend and torch.compile'd graphs (both call
``tpusim.backend.targets.flush_pending`` first). Other code reading storage directly should
call ``flush()`` first. Random ops run on the host generator so a seeded program draws exactly
what CPU PyTorch draws. Ops returning views, or mutating arguments other
than ``self``/``out``, run on the host too.

Ops that cannot run through the table fall back to the host with one warning per op;
``host_ops()`` lists them.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from tpusim.backend.lowering import jax_to_tensor, tensor_to_numpy  # fills the table, turns on jax x64

from tpusim import eager

aten = torch.ops.aten
MODES = eager.MODES          # "debug", "strict", "fused"


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
    windows: int = 0              # fused windows ended (as tpusim.fusion's FusionStats.windows)
    cuts: dict[str, int] = field(default_factory=dict)   # why they ended (FusionStats.cuts keys, pjrt_fused.py)


class _State:
    mode: str | None = None
    infos: dict[torch._ops.OpOverload, _OpInfo] = {}
    cache: dict[tuple, Callable | None] = {}      # signature -> jitted fn (None: run on host)
    host: dict[str, str] = {}                     # op name -> why it ran on the host
    arg_names: dict[torch._ops.OpOverload, set[str]] = {}
    stats = Stats()
    window: object = None                         # pjrt_fused.Window while in fused mode
    fused: object = None                          # the same Window kept across modes (its compile caches)


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


def _tensors(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensors of (args, kwargs) in pytree order (hand-written: it runs for every op, and aten
    arguments nest only lists and tuples)."""
    tensors: list[torch.Tensor] = []
    _collect(args, tensors)
    _collect(tuple(kwargs.values()), tensors)
    return tensors


def _split(args: tuple, kwargs: dict) -> tuple[list[torch.Tensor], Callable]:
    """The tensors of (args, kwargs), and a function putting replacements back. The function keeps the
    arguments' structure without their tensors: a cached computation must not keep memory alive."""
    tensors: list[torch.Tensor] = []
    hollow_args = _hollow(args, tensors)
    hollow_kwargs = {k: _hollow(v, tensors) for k, v in kwargs.items()}

    def rebuild(new: list) -> tuple[tuple, dict]:
        it = iter(new)
        return _fill(hollow_args, it), {k: _fill(v, it) for k, v in hollow_kwargs.items()}

    return tensors, rebuild


class _Hole:
    """Where a tensor was, in ``_split``'s skeleton."""


def _collect(v: object, acc: list[torch.Tensor]) -> None:
    if isinstance(v, torch.Tensor):
        acc.append(v)
    elif isinstance(v, (list, tuple)):
        for x in v:
            _collect(x, acc)


def _hollow(v: object, acc: list[torch.Tensor]) -> object:
    if isinstance(v, torch.Tensor):
        acc.append(v)
        return _Hole
    if isinstance(v, (list, tuple)) and not isinstance(v, torch.Size):
        return type(v)(_hollow(x, acc) for x in v)
    return v


def _fill(v: object, it: Iterator) -> object:
    if v is _Hole:
        return next(it)
    if isinstance(v, (list, tuple)) and not isinstance(v, torch.Size):
        return type(v)(_fill(x, it) for x in v)
    return v


def _lowered(op: torch._ops.OpOverload, args: tuple, kwargs: dict, lift: bool = False) -> Callable | None:
    """``f(*jax tensors) -> result`` for one op call, from the table or from its decomposition; ``lift``:
    ``f(*jax tensors, *floats)`` (table entries only: a decomposition is traced with its floats)."""
    from tpusim.backend.lowering import lookup

    entry = lookup(op)
    if lift and entry is None:
        return None
    if lift:
        args, kwargs, _ = _lift(args, kwargs)
    tensors, rebuild = _split(args, kwargs)
    if entry is not None:
        if not entry.jit:
            return None
        count = len(tensors)

        def direct(*arrays: object) -> object:
            a, k = rebuild(list(arrays[:count]))
            if lift:
                floats = iter(arrays[count:])
                a = tuple(next(floats) if v is _Float else v for v in a)
                k = {key: next(floats) if v is _Float else v for key, v in k.items()}
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
    specs = [jax.ShapeDtypeStruct(tuple(t.shape), jax_dtype(t.dtype)) if isinstance(t, torch.Tensor) else t
             for t in tensors]
    got = jax.eval_shape(fn, *specs)
    exp = [t for t in pytree.tree_leaves(expected) if isinstance(t, torch.Tensor)]
    out = [g for g in pytree.tree_leaves(got) if hasattr(g, "shape")]
    return len(exp) == len(out) and all(tuple(e.shape) == tuple(g.shape) and e.dtype == torch_dtype(g.dtype)
                                        for e, g in zip(exp, out))


class _Float:
    """Where a lifted Python float was, in ``_lift``'s skeleton."""


class Compiled:
    """One op signature's jitted computation. ``lifted``: its top-level Python floats (an optimizer's
    step size, bias corrections) are arguments, not constants, so a new value does not recompile it;
    call it with ``operands(...)``."""

    __slots__ = ("fn", "lifted", "__weakref__")

    def __init__(self, fn: Callable, lifted: bool) -> None:
        self.fn, self.lifted = fn, lifted

    def __call__(self, *xs: object) -> object:
        return self.fn(*xs)


def _lift(args: tuple, kwargs: dict) -> tuple[tuple, dict, list[float]]:
    """(args, kwargs) with their top-level Python floats replaced by ``_Float``, and those floats."""
    floats: list[float] = []

    def one(v: object) -> object:
        if type(v) is float:
            floats.append(v)
            return _Float
        return v

    return tuple(one(v) for v in args), {k: one(v) for k, v in kwargs.items()}, floats


def operands(fn: Compiled, args: tuple, kwargs: dict) -> list:
    """What ``fn`` is called with: the call's tensors, then its lifted floats (Python floats reach
    jax.jit weakly typed, so they promote like PyTorch's Python scalars)."""
    return _tensors(args, kwargs) + (_lift(args, kwargs)[2] if fn.lifted else [])


_UNLIFTABLE = object()      # cache value: this signature's lowering needs its floats as constants


def _compiled(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Compiled | None:
    """The computation of one op signature, built once: with its floats lifted where the lowering
    allows (so new values reuse it), else with them as constants; None: run it on the host."""
    lifted_args, lifted_kwargs, floats = _lift(args, kwargs)
    if floats:
        key = (op, _sig(lifted_args), _sig(lifted_kwargs), True)
        if key not in _S.cache:
            _S.cache[key] = _build(op, args, kwargs, floats) or _UNLIFTABLE
        if _S.cache[key] is not _UNLIFTABLE:
            return _S.cache[key]
    key = (op, _sig(args), _sig(kwargs), False)
    if key not in _S.cache:
        _S.cache[key] = _build(op, args, kwargs, None)
    return _S.cache[key]


def _build(op: torch._ops.OpOverload, args: tuple, kwargs: dict, floats: list[float] | None) -> Compiled | None:
    """Lower, check and jit one signature; ``floats``: lift them (a failure is then silent: the
    caller tries constants next)."""
    import jax

    lift = floats is not None
    try:
        lowered = _lowered(op, args, kwargs, lift)
        if lowered is not None and _agrees(lowered, op, args, kwargs, _tensors(args, kwargs) + (floats or [])):
            _S.stats.compiles += 1
            return Compiled(jax.jit(lowered), lift)
    except Exception as err:  # noqa: BLE001  (any failure to lower: run this signature on the host)
        if not lift:
            _note_host(op, f"lowering failed: {type(err).__name__}: {str(err).splitlines()[0][:120]}")
    return None


# ---------------------------------------------------------------- results


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
        return _host(op, plan, hargs, hkwargs, view=info.why == "returns a view")
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
        return window.add(plan.name, info, fn, args, fkwargs, outs)
    result = fn(*[tensor_to_numpy(t) if isinstance(t, torch.Tensor) else t for t in operands(fn, args, fkwargs)])
    _S.stats.ops += 1
    _S.stats.executions += 1
    return _finish(info, hargs, outs, result)


def _functional_kwargs(op: torch._ops.OpOverload) -> set[str]:
    names = _S.arg_names.get(op)
    if names is None:
        names = _S.arg_names[op] = {a.name for a in op._schema.arguments}
    return names


def _finish(info: _OpInfo, hargs: list, outs: dict, result: object) -> object:
    """Map jax results onto what the overload returns: fresh tensors, self, or the out= tensors."""
    if info.kind == "inplace":
        _write(hargs[0], jax_to_tensor(result))
        return hargs[0]
    if isinstance(result, (tuple, list)):
        values = [jax_to_tensor(r) if r is not None and hasattr(r, "shape") else r for r in result]
    else:
        values = jax_to_tensor(result) if hasattr(result, "shape") else result
    if info.kind == "out":
        dsts = list(outs.values())
        vals = values if isinstance(values, list) else [values]
        for d, v in zip(dsts, vals):
            _write(d, v)
        return dsts[0] if len(dsts) == 1 else tuple(dsts)
    return tuple(values) if isinstance(values, list) else values


def _host(op: torch._ops.OpOverload, plan: object, hargs: list, hkwargs: dict, view: bool = False) -> object:
    """The CPU kernel on the host aliases. In fused mode it runs outside the window: after a cut where
    fusion cuts (an opaque op), or where it touches pending values (``host``); a view op reads none."""
    from tpusim.backend.fallback import _cpu
    from tpusim.backend.state import STATE

    def run() -> object:
        _S.stats.host_ops += 1
        return _cpu(op, plan, hargs, hkwargs)

    window = _S.window
    if window is None or not STATE.numerics:
        return run()
    out_kw = {k: v for k, v in hkwargs.items() if k in plan.mutable_kw}
    writes = _tensors(tuple(hargs[i] for i in plan.mutable_pos if i < len(hargs)), out_kw)
    inputs = _tensors(tuple(hargs), {k: v for k, v in hkwargs.items() if k not in out_kw})
    cut = window.host_cut((op, _sig(hargs), _sig(hkwargs)), plan.name, inputs,
                          lambda: writes or _meta_outputs(op, hargs, hkwargs), tuple(hargs))
    if cut is not None:
        window.cut(cut)
        return run()
    return window.outside("host", [] if view else inputs, [] if view else writes, run)


def _meta_outputs(op: torch._ops.OpOverload, hargs: list, hkwargs: dict) -> list[torch.Tensor]:
    """The tensors an op would return, as meta tensors (none when it has no meta kernel)."""
    import torch.utils._pytree as pytree

    try:
        result = _meta_result(op, tuple(hargs), hkwargs)
    except Exception:  # noqa: BLE001  (no meta kernel: cost from the inputs alone)
        return []
    return [t for t in pytree.tree_leaves(result) if isinstance(t, torch.Tensor)]


# ---------------------------------------------------------------- switching


def enable(mode: str | None = None) -> None:
    """Run tpu ops through JAX from now on, in the eager mode; ``mode`` ("debug", "strict" or "fused")
    sets the eager mode first (``tpusim.set_eager_mode``), so the target and the device agree."""
    from tpusim.backend import fallback

    if mode is not None:
        eager.set_eager_mode(mode)
    disable()
    eager.on_change(_follow)
    fallback.executor = execute
    _apply(eager.get_eager_mode())


def _follow(old: str, new: str) -> None:
    """tpusim.eager listener: a change of eager mode switches the execution (while enabled)."""
    if _S.mode is not None:
        _apply(new)


def _apply(mode: str) -> None:
    """Execute in ``mode``: a fused window only in fused; pending work runs before a switch (``mode``)."""
    from tpusim.backend.targets.pjrt_fused import Window

    if mode == "fused" and _S.window is None:
        _S.fused = _S.fused or Window(_S.stats)
        _S.fused.stats = _S.stats
        _S.window = _S.fused
        _S.window.install()
    elif mode != "fused" and _S.window is not None:
        _end_window("mode")
    _S.mode = mode


def _end_window(reason: str) -> None:
    window, _S.window = _S.window, None
    try:
        window.cut(reason)
    finally:
        window.uninstall()


def disable() -> None:
    """Back to the sim target (CPU kernels), running pending work first (cut ``end``)."""
    from tpusim.backend import fallback

    if _S.window is not None:
        _end_window("end")
    _S.mode = None
    fallback.executor = fallback._cpu


def flush(reason: str = "end") -> None:
    """Run pending fused work now (no-op in strict and debug); ``reason`` names the cut in ``stats()``."""
    if _S.window is not None:
        _S.window.cut(reason)


def mode() -> str | None:
    """The mode the target executes in ("debug", "strict", "fused"), None when it is off."""
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
    """Enable the target when TPUSIM_TARGET=pjrt, in the eager mode (TPUSIM_EAGER_MODE, default strict)."""
    if os.environ.get("TPUSIM_TARGET", "sim").strip().lower() != "pjrt":
        return
    if os.environ.get("TPUSIM_PJRT_MODE") and not os.environ.get(eager.ENV):
        warnings.warn("tpusim pjrt: TPUSIM_PJRT_MODE is gone and ignored; the target follows the eager mode "
                      "(TPUSIM_EAGER_MODE=debug|strict|fused)", RuntimeWarning, stacklevel=2)
    enable()
