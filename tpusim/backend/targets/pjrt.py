"""The PJRT target (TPUSIM_TARGET=pjrt): tpu ops compute through JAX on JAX's default device.

``PJRT`` is a ``Target`` (targets/base.py): the device holds it (``STATE.target``) from
registration when its config names it (TPUSIM_TARGET=pjrt, ``DeviceConfig.target``), or from
``enable()`` until ``disable()``. Each op the fallback hands it runs as a cached ``jax.jit``
computation of its lowering (or of its Core ATen decomposition), on jax arrays made from the CPU
views of the tpu storage.

**Modes follow the eager mode** (tpusim/eager/state.py: ``tpusim.set_eager_mode``, ``eager_mode``,
``TPUSIM_EAGER_MODE``; there is no mode of the target's own). ``enable(name)`` sets the eager
mode; a change at run time switches the execution here, running pending work first (cut ``mode``):

- **strict**: one jitted computation per op signature (op, input shapes/dtypes, non-tensor
  arguments), executed at once; the result is written back to the tensor's host memory.
- **debug**: as strict, so every result is in memory when the device's debug check
  (tpusim/backend/dispatch/debug_mode.py: NaN/Inf at the op) reads it after the target ran the op.
- **fused**: the windows of tpusim.eager.fusion's Fused model, each traced into one jitted program
  (one XLA program, fused by XLA) and run at a cut: pjrt_fused.py, which also lists the cuts.
  Windows compile once per signature (op sequence, shapes, wiring), like the simulator's.

What both parts share (one op's computation, how it is called, how its results land, ``Stats``)
is in pjrt_ops.py; ops kept on the host run as the sim target runs them (``sim.run_kernel``).

**Synchronisation model** (honest version): host memory stays the source of truth. Every
executed computation copies its inputs from host memory into jax arrays and its outputs back
into host memory (on jax-CPU these are memcpys; on a TPU they are PCIe transfers, so this first
version measures dispatch and compile behaviour, not a TPU's steady-state speed). Everything
else that reads device memory through host aliases runs after a cut: the shim's native
item/copy, collectives of the tpusim c10d backend and torch.compile'd graphs (both call
``tpusim.backend.targets.flush_pending``, which asks the held target to ``flush``). Other code
reading storage directly should call ``flush()`` first. Random ops run on the host generator so
a seeded program draws exactly what CPU PyTorch draws. Ops returning views, or mutating
arguments other than ``self``/``out`` (tpusim/backend/aten/op_schema.py), run on the host too.

Ops that cannot run through the table fall back to the host with one warning per op;
``host_ops()`` lists them.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator

import jax
import torch
import torch.utils._pytree as pytree
from torch._decomp import core_aten_decompositions
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from tpusim.backend.aten import op_schema
from tpusim.backend.dispatch.fallback import OverloadPlan
from tpusim.backend.lowering import MissingLowering, jax_function, lookup  # fills the table, turns on jax x64
from tpusim.backend.lowering.dtypes import jax_dtype, torch_dtype
from tpusim.backend.plumbing.state import STATE
from tpusim.backend.targets.base import Target, use
from tpusim.backend.targets.pjrt_fused import Window
from tpusim.backend.targets.pjrt_ops import Compiled, Float, OpInfo, Stats, lift, run_now, tensors
from tpusim.backend.targets.sim import SIM, run_kernel
from tpusim.eager import state as eager

__all__ = ["PJRT", "Stats", "disable", "enable", "flush", "host_ops", "mode", "reset_stats", "stats"]

aten = torch.ops.aten


class _State:
    mode: str | None = None
    infos: dict[torch._ops.OpOverload, OpInfo] = {}
    cache: dict[tuple, Callable | None] = {}      # signature -> jitted fn (None: run on host)
    host: dict[str, str] = {}                     # op name -> why it ran on the host
    arg_names: dict[torch._ops.OpOverload, set[str]] = {}
    stats = Stats()
    window: Window | None = None                  # the fused window while in fused mode
    fused: Window | None = None                   # the same Window kept across modes (its compile caches)


_S = _State()


# ---------------------------------------------------------------- classification


def _classify(op: torch._ops.OpOverload) -> OpInfo:
    facts = op_schema.facts(op)
    if facts.returns_view:
        return OpInfo("host", why="returns a view")
    if not facts.writes:
        return OpInfo("functional", op)
    functional = op_schema.functional_of(op)
    if functional is None:
        return OpInfo("host", why="no functional overload")
    if facts.writes_self_only:
        return OpInfo("inplace", functional)
    if facts.writes_out_only:
        return OpInfo("out", functional)
    return OpInfo("host", why="mutates arguments other than self/out")


def _info(op: torch._ops.OpOverload) -> OpInfo:
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
    """The tensors of (args, kwargs), and a function putting replacements back. The function keeps the
    arguments' structure without their tensors: a cached computation must not keep memory alive."""
    found: list[torch.Tensor] = []
    hollow_args = _hollow(args, found)
    hollow_kwargs = {k: _hollow(v, found) for k, v in kwargs.items()}

    def rebuild(new: list) -> tuple[tuple, dict]:
        it = iter(new)
        return _fill(hollow_args, it), {k: _fill(v, it) for k, v in hollow_kwargs.items()}

    return found, rebuild


class _Hole:
    """Where a tensor was, in ``_split``'s skeleton."""


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


def _lowered(op: torch._ops.OpOverload, args: tuple, kwargs: dict, lifted: bool = False) -> Callable | None:
    """``f(*jax tensors) -> result`` for one op call, from the table or from its decomposition; ``lifted``:
    ``f(*jax tensors, *floats)`` (table entries only: a decomposition is traced with its floats)."""
    entry = lookup(op)
    if lifted and entry is None:
        return None
    if lifted:
        args, kwargs, _ = lift(args, kwargs)
    found, rebuild = _split(args, kwargs)
    if entry is not None:
        if not entry.jit:
            return None
        count = len(found)

        def direct(*arrays: object) -> object:
            a, k = rebuild(list(arrays[:count]))
            if lifted:
                floats = iter(arrays[count:])
                a = tuple(next(floats) if v is Float else v for v in a)
                k = {key: next(floats) if v is Float else v for key, v in k.items()}
            return entry.fn(*a, **k)

        return direct

    def call(*ts: torch.Tensor) -> object:
        a, k = rebuild(list(ts))
        return op(*a, **k)

    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fakes = [mode.from_tensor(t) for t in found]
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
    return op(*pytree.tree_map(_meta, args), **pytree.tree_map(_meta, kwargs))


def _agrees(fn: Callable, op: torch._ops.OpOverload, args: tuple, kwargs: dict, operands: list) -> bool:
    """The lowering's output shapes and dtypes equal PyTorch's own (meta kernel): checked once per signature."""
    try:
        expected = _meta_result(op, args, kwargs)
    except Exception:  # noqa: BLE001  (no meta kernel: trust the lowering)
        return True
    specs = [jax.ShapeDtypeStruct(tuple(t.shape), jax_dtype(t.dtype)) if isinstance(t, torch.Tensor) else t
             for t in operands]
    got = jax.eval_shape(fn, *specs)
    exp = [t for t in pytree.tree_leaves(expected) if isinstance(t, torch.Tensor)]
    out = [g for g in pytree.tree_leaves(got) if hasattr(g, "shape")]
    return len(exp) == len(out) and all(tuple(e.shape) == tuple(g.shape) and e.dtype == torch_dtype(g.dtype)
                                        for e, g in zip(exp, out))


_UNLIFTABLE = object()      # cache value: this signature's lowering needs its floats as constants


def _compiled(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Compiled | None:
    """The computation of one op signature, built once: with its floats lifted where the lowering
    allows (so new values reuse it), else with them as constants; None: run it on the host."""
    lifted_args, lifted_kwargs, floats = lift(args, kwargs)
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
    lifted = floats is not None
    try:
        lowered = _lowered(op, args, kwargs, lifted)
        if lowered is not None and _agrees(lowered, op, args, kwargs, tensors(args, kwargs) + (floats or [])):
            _S.stats.compiles += 1
            return Compiled(jax.jit(lowered), lifted)
    except Exception as err:  # noqa: BLE001  (any failure to lower: run this signature on the host)
        if not lifted:
            _note_host(op, f"lowering failed: {type(err).__name__}: {str(err).splitlines()[0][:120]}")
    return None


# ---------------------------------------------------------------- results


def _note_host(op: torch._ops.OpOverload, why: str) -> None:
    name = str(op)
    if name not in _S.host:
        _S.host[name] = why
        warnings.warn(f"tpusim pjrt: {name} runs on the host (CPU kernel): {why}", RuntimeWarning, stacklevel=4)


# ---------------------------------------------------------------- executing one op


def execute(op: torch._ops.OpOverload, plan: OverloadPlan, hargs: list, hkwargs: dict) -> object:
    """One op on the PJRT target (``PJRT.execute``; see the module docstring)."""
    if not STATE.numerics or plan.random or plan.kernel is not None:
        return _host(op, plan, hargs, hkwargs)
    info = _info(op)
    if op is aten.native_batch_norm.default and hargs[5] and hargs[3] is not None:
        info = OpInfo("host", why="updates running statistics in place (an unannotated mutation)")
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
    return run_now(info, fn, args, fkwargs, outs, _S.stats)


def _functional_kwargs(op: torch._ops.OpOverload) -> set[str]:
    names = _S.arg_names.get(op)
    if names is None:
        names = _S.arg_names[op] = {a.name for a in op._schema.arguments}
    return names


def _host(op: torch._ops.OpOverload, plan: OverloadPlan, hargs: list, hkwargs: dict, view: bool = False) -> object:
    """The CPU kernel on the host aliases (as the sim target runs it). In fused mode it runs outside the
    window: alone where fusion cuts (an opaque op), after a cut where it touches pending values
    (``host``); a view op reads none."""

    def run() -> object:
        _S.stats.host_ops += 1
        return run_kernel(op, plan, hargs, hkwargs)

    window = _S.window
    if window is None or not STATE.numerics:
        return run()
    out_kw = {k: v for k, v in hkwargs.items() if k in plan.mutable_kw}
    writes = tensors(tuple(hargs[i] for i in plan.mutable_pos if i < len(hargs)), out_kw)
    inputs = tensors(tuple(hargs), {k: v for k, v in hkwargs.items() if k not in out_kw})
    if not window.host_fusible(plan.name):
        return window.alone(run)
    return window.outside("host", [] if view else inputs, [] if view else writes, run)


# ---------------------------------------------------------------- the target


class PjrtTarget(Target):
    """The held target while the device computes through JAX (see the module docstring)."""

    name = "pjrt"

    def execute(self, op: torch._ops.OpOverload, plan: OverloadPlan, host_args: list, host_kwargs: dict) -> object:
        return execute(op, plan, host_args, host_kwargs)

    def flush(self, reason: str) -> None:
        flush(reason)

    def on_mode_change(self, old: str, new: str) -> None:
        """A change of eager mode switches the execution, running pending work first (cut ``mode``)."""
        _apply(new)

    def activate(self) -> None:
        _apply(eager.get_eager_mode())

    def deactivate(self) -> None:
        if _S.window is not None:
            _end_window("end")
        _S.mode = None


PJRT = PjrtTarget()


def enable(mode: str | None = None) -> None:
    """Run tpu ops through JAX from now on, in the eager mode; ``mode`` ("debug", "strict" or "fused")
    sets the eager mode first (``tpusim.set_eager_mode``), so the target and the device agree."""
    if mode is not None:
        eager.set_eager_mode(mode)
    use(PJRT)


def _apply(mode: str) -> None:
    """Execute in ``mode``: a fused window only in fused; pending work runs before a switch (``mode``)."""
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
    if STATE.target is PJRT:
        use(SIM)


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
    """Count from zero; a pending fused window keeps its size (it ends where fusion ends it)."""
    pending = _S.stats.cutter.size
    _S.stats = Stats()
    _S.stats.cutter.size = pending
    if _S.fused is not None:
        _S.fused.stats = _S.stats
