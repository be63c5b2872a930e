"""The one boxed fallback: every aten op without a native kernel runs here (in Python where it must).

An op on tpu tensors runs as the CPU kernel on zero-copy host aliases of the device memory
(meta aliases in shape-only mode), and its results are mapped back to the device: outputs that
alias an input become views of the device storage, fresh results are adopted without a copy,
mutated arguments (in-place, out=) get the kernel's new shape and bytes (``sync_back``).

The values themselves are computed by the held target (``STATE.target.execute``,
tpusim/backend/targets/: the CPU kernel at once on the sim target, JAX on the pjrt target). Per call
the fallback also: swaps in the device's generator for random ops (so a seeded tpu program
draws what the CPU one draws), refuses mixed CPU/tpu inputs where CUDA would, applies the
float64 policy (tpusim/backend/aten/float64_policy.py), hands the op to the recorder when one is active and, in
debug eager mode, to tpusim/backend/dispatch/debug_mode.py (NaN/Inf check at the op). What it needs to know about an
overload (its ``OverloadPlan``) comes from its schema (tpusim/backend/aten/op_schema.py), read once.
Ops whose CPU kernel is wrong for the device are one entry each in tpusim/backend/aten/handwritten_kernels.py.

Where it runs: the boxed fallback the dispatcher calls is the shim's (tpusim/backend/csrc/fallback.cpp).
It does all of the above in C++ for the common call on the simulator target (the CPU kernel on
aliases, random draws from the device's generator, results mapped back, the op logged for the
recorder; in shape-only mode results made from a signature seen before) and calls ``fallback`` here for the
rest: what ``native_plan`` sends here for an overload (hand-written kernels, device arguments,
ops outside aten), calls only this module handles (float64/complex: the policy; mixed
devices; CPU index tensors; tensor subclasses), and every call on another target or in debug
eager mode. ``install`` also registers the fallback explicitly for the overloads whose
CompositeExplicitAutograd kernel would otherwise run on tpu where CPU runs a kernel of its own
(``composite_shadowed``: nn.LayerNorm is CPU's native_layer_norm, not a batch-norm decomposition).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tpusim.backend.aten import float64_policy, handwritten_kernels, op_schema
from tpusim.backend.aten.op_schema import DEVICE, DTYPE, TENSOR, TENSOR_LIST
from tpusim.backend.dispatch import debug_mode, offload
from tpusim.backend.plumbing import shim, source
from tpusim.backend.plumbing.source import user_source
from tpusim.backend.plumbing.state import STATE
from tpusim.backend.program_trace import op_programs, recorder

_F64 = float64_policy.NON_NATIVE_DTYPES
_CPU_INDEX_OK = {"aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_",
                 "aten::_unsafe_index", "aten::_unsafe_index_put"}


@dataclass
class OverloadPlan:
    """What the fallback (and the target computing the op) needs to know about one overload, computed once."""

    name: str
    pos: list[tuple[int, int]]       # (position, kind) of the arguments to convert
    kw: dict[str, int]                # name -> kind of the kwarg-only arguments to convert
    mutable_pos: list[int]
    mutable_kw: list[str]
    gen_index: int                    # position of the Generator? argument, -1 if none
    gen_name: str
    random: bool
    kernel: object                    # hand-written replacement, or None
    cpu_ok: bool                      # CPU tensors of any rank may be mixed in (index ops)


_PLANS: dict[object, OverloadPlan] = {}


def _plan(op: torch._ops.OpOverload) -> OverloadPlan:
    facts = op_schema.facts(op)
    name = facts.name
    gen_index, gen_name = facts.generator_position, facts.generator_keyword
    random = torch.Tag.nondeterministic_seeded in op.tags or gen_index >= 0 or bool(gen_name)
    plan = OverloadPlan(name, list(facts.positional), dict(facts.keyword), list(facts.written_positions),
                list(facts.written_keywords), gen_index, gen_name, random,
                handwritten_kernels.KERNELS.get(f"{name}.{op._overloadname}") or handwritten_kernels.KERNELS.get(name),
                name in _CPU_INDEX_OK)
    _PLANS[op] = plan
    return plan


class _Call:
    """Host-side view of one call: aliases made, device chosen, what to sync back."""

    __slots__ = ("plan", "device", "pairs", "f64", "cpu_arg", "inputs")

    def __init__(self, plan: OverloadPlan) -> None:
        self.plan = plan
        self.device = -1
        self.pairs: dict[int, torch.Tensor] = {}   # id(alias) -> device tensor
        self.f64 = False
        self.cpu_arg: torch.Tensor | None = None
        self.inputs: list[torch.Tensor] = []

    def tensor(self, t: object) -> object:
        if not isinstance(t, torch.Tensor):
            if isinstance(t, (int, float, bool, complex)):   # a wrapped number: back to a 0-dim tensor
                t = torch.tensor(t)
                return t if STATE.numerics else t.to(STATE.host_device)
            return t                                          # None
        dev = t.device
        if dev.type != "tpu":
            if self.cpu_arg is None and t.dim() > 0 and not self.plan.cpu_ok:
                self.cpu_arg = t
            if not STATE.numerics and t.dim() == 0 and dev.type == "cpu":  # meta kernels refuse CPU scalars
                return t.to(STATE.host_device)
            return t
        if self.device < 0:
            self.device = dev.index
        elif dev.index != self.device:
            _mixed(self.plan, f"tpu:{self.device}", str(dev), t)
        if t.dtype in _F64:
            self.f64 = True
        alias = STATE.shim.host_alias(t)
        self.pairs[id(alias)] = t
        self.inputs.append(t)
        return alias

    def convert(self, kind: int, value: object) -> object:
        if kind == TENSOR:
            return self.tensor(value)
        if kind == TENSOR_LIST:
            return [self.tensor(v) for v in value] if value is not None else None
        if kind == DEVICE:
            if value is not None and torch.device(value).type == "tpu":
                d = torch.device(value)
                if self.device < 0:
                    self.device = d.index if d.index is not None else STATE.shim.current_device()
                return STATE.host_device
            return value
        if kind == DTYPE:
            if value in _F64:
                self.f64 = True
            return value
        return value


def _mixed(plan: OverloadPlan, a: str, b: str, t: torch.Tensor) -> None:
    where = user_source()
    raise RuntimeError(
        f"Expected all tensors to be on the same device, but found at least two devices, {a} and {b}! "
        f"({plan.name} got a tensor of shape {list(t.shape)} on {b}"
        f"{' at ' + where if where else ''}; move it with .to('{a}'))")


def fallback(op: torch._ops.OpOverload, *args: object, **kwargs: object) -> object:
    """Run ``op`` on host aliases of its tpu arguments; see the module docstring."""
    plan = _PLANS.get(op) or _plan(op)
    call = _Call(plan)
    hargs = list(args)
    n = len(hargs)
    for i, kind in plan.pos:
        if i < n:
            hargs[i] = call.convert(kind, hargs[i])
    hkwargs = kwargs
    if plan.kw and kwargs:
        hkwargs = dict(kwargs)
        n_in = len(call.inputs)
        for name, kind in plan.kw.items():
            if name in hkwargs:
                hkwargs[name] = call.convert(kind, hkwargs[name])
        if plan.mutable_kw:                      # out= arguments are written, not read
            del call.inputs[n_in:]
    if call.cpu_arg is not None and call.inputs:
        _mixed(plan, f"tpu:{call.device}", "cpu", call.cpu_arg)
    if call.device < 0:
        call.device = STATE.shim.current_device()
    if call.f64 or plan.name in float64_policy.NON_NATIVE_RESULTS:  # complex results from real inputs too
        float64_policy.non_native(plan.name, call.inputs)

    input_bad = debug_mode.before(plan, args, kwargs, call.inputs) if STATE.debug else False
    if plan.random and STATE.numerics:
        result = _run_random(op, plan, call, hargs, hkwargs)
    else:
        result = _run(op, plan, hargs, hkwargs)

    shim = STATE.shim
    mutated: list[torch.Tensor] = []
    for i in plan.mutable_pos:
        if i < n:
            _sync(shim, args[i], hargs[i], mutated)
    for name in plan.mutable_kw:
        if name in kwargs:
            _sync(shim, kwargs[name], hkwargs[name], mutated)
    out = _back(shim, call, result)
    if STATE.recording:
        recorder.record_op(op, plan.name, call.inputs, out, args, kwargs, mutated)
    if STATE.debug:                              # debug eager mode: NaN/Inf check, per-op log
        debug_mode.after(plan.name, call.inputs, out, mutated, args, kwargs, input_bad)
    return out


def _run(op: torch._ops.OpOverload, plan: OverloadPlan, hargs: list, hkwargs: dict) -> object:
    try:
        return STATE.target.execute(op, plan, hargs, hkwargs)
    except NotImplementedError as err:
        if not STATE.numerics and "Meta" in str(err):
            raise NotImplementedError(
                f"tpusim: {plan.name} has no shape function (meta kernel), so it cannot run in shape-only "
                f"mode (TPUSIM_NUMERICS=off). Run with TPUSIM_NUMERICS=on.") from err
        raise
    except RuntimeError as err:
        if not STATE.numerics and ("data-dependent" in str(err) or "meta" in str(err).lower()):
            raise RuntimeError(
                f"tpusim: {plan.name} cannot run in shape-only mode (TPUSIM_NUMERICS=off): its output shape "
                f"depends on tensor values, which this mode does not have. Original error: {err}") from err
        raise


def _run_random(op: torch._ops.OpOverload, plan: OverloadPlan, call: _Call, hargs: list, hkwargs: dict) -> object:
    """Run a random op on the tpu generator's state, through the CPU default generator."""
    if plan.gen_index >= 0:
        gen = hargs[plan.gen_index] if plan.gen_index < len(hargs) else None
    else:
        gen = hkwargs.get(plan.gen_name) if plan.gen_name else None
    if gen is not None and gen.device.type != "tpu":
        return _run(op, plan, hargs, hkwargs)       # a CPU generator: use it as given
    if gen is None:
        gen = STATE.default_generators[call.device]
    if plan.gen_index >= 0 and plan.gen_index < len(hargs):
        hargs[plan.gen_index] = None
    elif plan.gen_name and plan.gen_name in hkwargs:
        hkwargs = dict(hkwargs)
        hkwargs[plan.gen_name] = None
    host = torch.default_generator
    saved = host.get_state()
    host.set_state(gen.get_state())
    try:
        return _run(op, plan, hargs, hkwargs)
    finally:
        gen.set_state(host.get_state())
        host.set_state(saved)


def _sync(shim: object, dst: object, alias: object, mutated: list[torch.Tensor]) -> None:
    """Carry what the kernel did to a mutable argument's alias over to the device tensor."""
    if isinstance(dst, torch.Tensor):
        if alias is not dst:
            shim.sync_back(dst, alias)
            mutated.append(dst)
    elif isinstance(dst, (list, tuple)):
        pairs = [(d, a) for d, a in zip(dst, alias, strict=True)
                 if isinstance(d, torch.Tensor) and a is not d]
        if pairs:
            shim.sync_back_list([d for d, _ in pairs], [a for _, a in pairs])
            mutated.extend(d for d, _ in pairs)


def _back(shim: object, call: _Call, result: object) -> object:
    """Host results -> device tensors (identity for returned arguments)."""
    pairs = call.pairs
    if isinstance(result, torch.Tensor):
        orig = pairs.get(id(result))
        if orig is not None:
            return orig
        return shim.to_device([result], call.device)[0]
    if isinstance(result, (tuple, list)):
        fresh = [r for r in result if isinstance(r, torch.Tensor) and id(r) not in pairs]
        mapped = iter(shim.to_device(fresh, call.device)) if fresh else iter(())
        items = []
        for r in result:
            if isinstance(r, torch.Tensor):
                orig = pairs.get(id(r))
                items.append(orig if orig is not None else next(mapped))
            elif isinstance(r, (tuple, list)):
                items.append(_back(shim, call, r))
            else:
                items.append(r)
        return type(result)(items) if isinstance(result, tuple) else items
    return result


_INSTALLED: list[bool] = []


def _lookup(name: str) -> torch._ops.OpOverload:
    namespace, _, rest = name.partition("::")
    base, _, overload = rest.partition(".")
    return getattr(getattr(getattr(torch.ops, namespace), base), overload or "default")


def native_plan(name: str) -> tuple:
    """What the shim's fallback needs to know about overload ``name`` ("aten::add.Tensor"), asked once:
    (the OpOverload, its recorded name, whether every call comes here, whether its cost is asked at the op
    (``op_programs.asked_at_op``), the indices of the arguments it writes, of its dtype arguments, whether a
    result may be a view of an argument, whether it draws random numbers, the index of its Generator?
    argument or -1, whether a kernel of the shim's own may stand in for its hand-written one (an aten op
    without device arguments: tpusim/backend/csrc/fallback.cpp native_kernels)). Random ops draw from the device's
    generator as ``_run_random`` does here."""
    op = _lookup(name)
    plan = _PLANS.get(op) or _plan(op)
    facts = op_schema.facts(op)
    names = [a.name for a in op._schema.arguments]
    kinds = [*facts.positional, *((names.index(k), kind) for k, kind in facts.keyword)]
    native_ok = name.startswith("aten::") and not any(kind == DEVICE for _, kind in kinds)
    python = plan.kernel is not None or not native_ok
    python = python or plan.name in float64_policy.NON_NATIVE_RESULTS  # the float64/complex policy at the op
    written = [*facts.written_positions, *(names.index(k) for k in facts.written_keywords)]
    generator = plan.gen_index if plan.gen_index >= 0 else names.index(plan.gen_name) if plan.gen_name else -1
    return (op, plan.name, python, op_programs.asked_at_op(plan.name), written,
            [i for i, kind in kinds if kind == DTYPE], facts.returns_view, plan.random, generator, native_ok)


# In-place composites whose CPU behaviour hangs on C++ reference identity, which a boxed call cannot keep:
# CPU's addr_ calls addr_out(self, self, ...), whose kernel refuses a self of the wrong shape only when its
# output *is* its input (&result == &self); boxed, the two are copies, so "tpu" resized x.addr_(v1, v2) where
# CPU raises. Run as CPU's own op on the host alias, they behave as on CPU. Adding one = one name here.
CPU_COMPOSITES = ("aten::addr_",)


def composite_shadowed() -> list[str]:
    """The aten overloads whose CompositeExplicitAutograd kernel would run on tpu in place of the fallback
    although CPU has a kernel of its own (native_layer_norm, native_group_norm, addr, _stack, all/any.dims,
    linalg__powsum in torch 2.13): asked of the dispatcher, so another torch's list is found too."""
    c, key = torch._C, torch._C.DispatchKey
    has = c._dispatch_has_kernel_for_dispatch_key
    return [name for name in c._dispatch_get_all_op_names()
            if name.startswith("aten::") and has(name, key.CompositeExplicitAutograd) and has(name, key.CPU)
            and not has(name, key.CompositeImplicitAutograd) and not has(name, key.PrivateUse1)]


def install() -> None:
    """Install the shim's fallback for the PrivateUse1 key (with this module's ``fallback`` for the calls it
    hands over), and register it explicitly for the ``composite_shadowed`` overloads and the hand-written
    kernels' (some, like convolution_overrideable, have a composite kernel the fallback would never see; the
    fused RNN cells' run in the shim's C++ twins, the others come back here)."""
    if _INSTALLED:
        return
    module = shim.load()                         # STATE.shim is set once registration is done
    source.install(module)
    offload.install(module)
    module.install_fallback(fallback, native_plan, recorder.shaped_cost)
    names = dict.fromkeys((*composite_shadowed(), *CPU_COMPOSITES, *handwritten_kernels.KERNELS))
    module.register_fallback([name.removeprefix("aten::") for name in names])
    _INSTALLED.append(True)
