"""``--numerics tpu`` (TPUSIM_NUMERICS=tpu): f32 contractions computed as a TPU's MXU computes them.

The MXU multiplies bf16 and accumulates in f32, so a TPU computes an f32 matmul from its operands split
into bf16 parts, ``hi(x) = bf16(x)`` and ``lo(x) = bf16(x - hi(x))``, in as many passes as the precision
in effect asks (``torch.tpu.precision``: StableHLO's dot_general precision, TorchTPU's default DEFAULT):

    DEFAULT   one pass      hi(a).hi(b)
    HIGH      three passes  hi(a).hi(b) + (hi(a).lo(b) + lo(a).hi(b))      (XLA's bf16_3x)
    HIGHEST   f32           the CPU kernel as it is: CPU's numbers, bit for bit

Products of bf16 values are exact in f32, so each pass is the CPU's own f32 kernel on bf16-valued
operands: its products, accumulated in f32. Operands already bf16, f16 or integer are computed as they are.
What counts as a contraction (``RULES``): mm, bmm, addmm, baddbmm, addbmm, addmv, dot, vdot,
_addmm_activation, convolution and its backward, and attention (CPU's flash kernel and its backward,
recomputed as two matmuls around an f32 softmax, so the probabilities are rounded at the second matmul as
on a TPU); matmul, linear, einsum, tensordot, conv*d and the SDPA math path reach these on their way down.

Where: the sim target computes a device op in ``ROUTED`` (tpusim/backend/targets/sim.py) through ``execute``,
which runs its CPU kernel under ``ContractionMode``, a dispatch mode on the host tensors that catches the
contractions the kernel calls: the op itself, the convolution or attention a hand-written kernel
(tpusim/backend/aten/handwritten_kernels.py) calls, the matmuls inside a ``tpu::`` kernel (torch.tpu.ops). The common op
otherwise runs in the shim's C++ without Python (csrc/fallback.cpp), so ``configure`` registers the plain
contractions' overloads for the device while tpu numerics is on (their calls then come to the Python
fallback) and removes them when it is off: nothing changes, and nothing is paid, with numerics on.
A torch.compile'd graph runs its Core ATen ops on host tensors under the same mode (``GraphNumerics.run``,
called by tpusim/backend/torch_compile/jax_backend.py) instead of through JAX, whose CPU ignores dot precision.

``allow_excess_precision`` (torch.backends.tpu; XLA's --xla_allow_excess_precision, TorchTPU's default
off) lets XLA drop a rounding to bf16/f16 between two operations of one compiled program: the value stays
in f32 (its f32 -> bf16 -> f32 conversions are removed; a bf16 matmul's f32 accumulator feeds the next op
unrounded). Each eager op is a program of its own, so eager results are always rounded to their dtype;
here a compiled graph run while it is on keeps every bf16/f16 value it computes in f32 (XLA's right, taken
in full), rounding only what the graph returns. Values stored in a tensor (graph inputs, constants) are
already in their dtype. A graph takes the precision and the flag in effect when it was compiled, as an
XLA program does (TorchTPU: the flag applies to "all future compilations").

The settings are read from torch.tpu's own state (tpusim/backend/torchtpu/precision.py hands its readers
over with ``use_settings``), so there is one source of truth.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.fx

from tpusim.backend.dispatch import fallback
from tpusim.backend.dispatch.dispatch_mode import DeviceDispatchMode
from tpusim.backend.plumbing.state import STATE

aten = torch.ops.aten
DEFAULT, HIGH, HIGHEST = "default", "high", "highest"     # torch.tpu.Precision values
LOW = (torch.bfloat16, torch.float16)                     # what allow_excess_precision may keep in f32


class _State:
    def __init__(self) -> None:
        self.on = False                                   # DeviceConfig.tpu_numerics
        self.precision: Callable[[], str] = lambda: DEFAULT
        self.allow_excess: Callable[[], bool] = lambda: False
        self.library: torch.library.Library | None = None  # the device's kernels for the plain contractions


_S = _State()


def use_settings(precision: Callable[[], str], allow_excess: Callable[[], bool]) -> None:
    """Where the precision in effect and allow_excess_precision are read (torch.tpu's state)."""
    _S.precision, _S.allow_excess = precision, allow_excess


def is_on() -> bool:
    return _S.on


# ---------------------------------------------------------------- bf16 parts and passes


def _f32(x: object) -> bool:
    return isinstance(x, torch.Tensor) and x.dtype == torch.float32


def _hi(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).to(torch.float32)


def _parts(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x = hi + lo (+ what bf16_3x drops): hi = bf16(x), lo = bf16(x - hi); an inf or NaN lives in hi alone."""
    hi = _hi(x)
    return hi, _hi(torch.nan_to_num(x - hi, nan=0.0, posinf=0.0, neginf=0.0))


def _with(args: tuple | list, parts: dict[int, torch.Tensor]) -> list:
    return [parts.get(i, a) for i, a in enumerate(args)]


def contract(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], a: torch.Tensor, b: torch.Tensor,
             precision: str) -> torch.Tensor:
    """``fn(a, b)`` (bilinear in a and b) at ``precision`` when both are f32."""
    if precision == HIGHEST or not (_f32(a) and _f32(b)):
        return fn(a, b)
    if precision == DEFAULT:
        return fn(_hi(a), _hi(b))
    (ah, al), (bh, bl) = _parts(a), _parts(b)
    return fn(ah, bh) + (fn(ah, bl) + fn(al, bh))


Rule = Callable[[torch._ops.OpOverload, tuple, dict, str], object]


def _bilinear(i: int, j: int, bare: Callable[[list, dict], torch.Tensor]) -> Rule:
    """An op contracting arguments i and j: its first pass is the op itself on the hi parts (bias, beta,
    alpha, out= and in-place as CPU has them); HIGH adds the cross passes, each the op's contraction alone
    (``bare``), into what it returned."""
    def rule(func: torch._ops.OpOverload, args: tuple, kwargs: dict, precision: str) -> object:
        a, b = args[i], args[j]
        if not (_f32(a) and _f32(b)):
            return func(*args, **kwargs)
        if precision == DEFAULT:
            return func(*_with(args, {i: _hi(a), j: _hi(b)}), **kwargs)
        (ah, al), (bh, bl) = _parts(a), _parts(b)
        result = func(*_with(args, {i: ah, j: bh}), **kwargs)
        result.add_(bare(_with(args, {i: ah, j: bl}), kwargs) + bare(_with(args, {i: al, j: bh}), kwargs))
        return result
    return rule


def _product(op: torch._ops.OpOverload) -> Rule:
    return _bilinear(0, 1, lambda a, kw: op(a[0], a[1]))


def _scaled_sum(op: torch._ops.OpOverload) -> Rule:
    """addmm-like: beta * self + alpha * (arguments 1 . 2); the cross passes are the op with beta 0."""
    return _bilinear(1, 2, lambda a, kw: op(a[0], a[1], a[2], beta=0, alpha=kw.get("alpha", 1)))


def _addmm_activation(func: torch._ops.OpOverload, args: tuple, kwargs: dict, precision: str) -> object:
    """relu/gelu(addmm): the activation is not linear, so HIGH sums the passes first, then activates."""
    if not (_f32(args[1]) and _f32(args[2])):
        return func(*args, **kwargs)
    if precision == DEFAULT:
        return func(*_with(args, {1: _hi(args[1]), 2: _hi(args[2])}), **kwargs)
    options = {k: v for k, v in kwargs.items() if k in ("beta", "alpha")}
    pre = _scaled_sum(aten.addmm.default)(aten.addmm.default, args[:3], options, precision)
    value = torch.nn.functional.gelu(pre, approximate="tanh") if kwargs.get("use_gelu") else pre.relu()
    if "out" not in kwargs:
        return value
    return func(*args, **kwargs).copy_(value)                # out= resized and checked as CPU does


def _convolution_backward(func: torch._ops.OpOverload, args: tuple, kwargs: dict, precision: str) -> object:
    """(grad_input, grad_weight, grad_bias): the first two contract (grad_output, weight) and (input,
    grad_output); three passes over (grad_output, input, weight) = (hi, hi, hi), (hi, lo, lo), (lo, hi, hi)
    give both their bf16_3x terms. grad_bias is a sum of grad_output (VPU work, f32)."""
    grad, inp, weight = args[:3]
    if not (_f32(grad) and _f32(inp) and _f32(weight)):
        return func(*args, **kwargs)
    mask = list(args[10])
    contracted = _with(args, {10: [mask[0], mask[1], False]})
    if precision == DEFAULT:
        grad_input, grad_weight, _ = func(*_with(contracted, {0: _hi(grad), 1: _hi(inp), 2: _hi(weight)}))
    else:
        (gh, gl), (xh, xl), (wh, wl) = _parts(grad), _parts(inp), _parts(weight)
        grad_input, grad_weight, _ = func(*_with(contracted, {0: gh, 1: xh, 2: wh}))
        small = [func(*_with(contracted, {0: g, 1: x, 2: w})) for g, x, w in ((gh, xl, wl), (gl, xh, wh))]
        grad_input = grad_input + (small[0][0] + small[1][0]) if mask[0] else grad_input
        grad_weight = grad_weight + (small[0][1] + small[1][1]) if mask[1] else grad_weight
    grad_bias = func(*_with(args, {10: [False, False, True]}))[2] if mask[2] else None
    return grad_input, grad_weight, grad_bias


# ---------------------------------------------------------------- attention


def _scores(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None, is_causal: bool, scale: float,
            precision: str) -> torch.Tensor:
    s = contract(torch.matmul, q, k.transpose(-2, -1), precision) * scale
    if is_causal:
        keep = torch.ones(s.shape[-2], s.shape[-1], dtype=torch.bool).tril()
        s = s.masked_fill(~keep, float("-inf"))
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
    return s


def _probabilities(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(s) in f32 and its log-sum-exp; a row with every key masked gives zeros."""
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1)
    dead = torch.isneginf(lse)
    return (p.masked_fill(dead.unsqueeze(-1), 0.0) if bool(dead.any()) else p), lse


def _grouped(x: torch.Tensor, heads: int) -> torch.Tensor:
    return x if x.shape[1] == heads else x.repeat_interleave(heads // x.shape[1], dim=1)


def _attention_arguments(args: tuple, kwargs: dict, first: int) -> tuple:
    """(dropout_p, is_causal, attn_mask, scale) of CPU's flash op and its backward (positions from ``first``)."""
    dropout = args[first] if len(args) > first else kwargs.get("dropout_p", 0.0)
    causal = args[first + 1] if len(args) > first + 1 else kwargs.get("is_causal", False)
    return dropout, bool(causal), kwargs.get("attn_mask"), kwargs.get("scale")


def _flash(func: torch._ops.OpOverload, args: tuple, kwargs: dict, precision: str) -> object:
    """``_scaled_dot_product_flash_attention_for_cpu`` -> (output, logsumexp), at ``precision``."""
    q, k, v = args[:3]
    dropout, is_causal, mask, scale = _attention_arguments(args, kwargs, 3)
    if dropout or not (_f32(q) and _f32(k) and _f32(v)):
        return func(*args, **kwargs)
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    heads = q.shape[1]
    p, lse = _probabilities(_scores(q, _grouped(k, heads), mask, is_causal, scale, precision))
    return contract(torch.matmul, p, _grouped(v, heads), precision), lse


def _flash_backward(func: torch._ops.OpOverload, args: tuple, kwargs: dict, precision: str) -> object:
    """Its backward -> (grad_q, grad_k, grad_v): every matmul of attention's gradient at ``precision``."""
    grad, q, k, v, out = args[:5]
    dropout, is_causal, mask, scale = _attention_arguments(args, kwargs, 6)
    if dropout or not all(_f32(t) for t in (grad, q, k, v)):
        return func(*args, **kwargs)
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    heads, kv_heads = q.shape[1], k.shape[1]
    kf, vf = _grouped(k, heads), _grouped(v, heads)
    p, _ = _probabilities(_scores(q, kf, mask, is_causal, scale, precision))
    dv = contract(torch.matmul, p.transpose(-2, -1), grad, precision)
    dp = contract(torch.matmul, grad, vf.transpose(-2, -1), precision)
    ds = p * (dp - (grad * out).sum(-1, keepdim=True))
    dq = contract(torch.matmul, ds, kf, precision) * scale
    dk = contract(torch.matmul, ds.transpose(-2, -1), q, precision) * scale
    if kv_heads != heads:
        dk = dk.unflatten(1, (kv_heads, heads // kv_heads)).sum(2)
        dv = dv.unflatten(1, (kv_heads, heads // kv_heads)).sum(2)
    return dq, dk, dv


PRODUCTS = ("mm", "bmm", "dot", "vdot")                    # a . b
SCALED_SUMS = ("addmm", "baddbmm", "addbmm", "addmv")        # beta * self + alpha * (a . b), and their "_" forms
PLAIN = (*PRODUCTS, *SCALED_SUMS, *(f"{name}_" for name in SCALED_SUMS), "_addmm_activation")
RULES: dict[str, Rule] = {
    **{f"aten::{name}": _product(getattr(aten, name).default) for name in PRODUCTS},
    **{f"aten::{name}{inplace}": _scaled_sum(getattr(aten, name).default)     # the cross passes: functional
       for name in SCALED_SUMS for inplace in ("", "_")},
    "aten::_addmm_activation": _addmm_activation,
    "aten::convolution": _bilinear(0, 1, lambda a, kw: aten.convolution.default(a[0], a[1], None, *a[3:])),
    "aten::convolution_backward": _convolution_backward,
    "aten::_scaled_dot_product_flash_attention_for_cpu": _flash,
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": _flash_backward,
}
_ATTENTION_RULES = frozenset({"aten::_scaled_dot_product_flash_attention_for_cpu",
                              "aten::_scaled_dot_product_flash_attention_for_cpu_backward"})
# Device ops whose CPU kernel contracts: the rules' own, and the hand-written kernels that call them.
ROUTED = frozenset(RULES) | {"aten::convolution_overrideable", "aten::convolution_backward_overrideable",
                             "aten::_scaled_dot_product_fused_attention_overrideable",
                             "aten::_scaled_dot_product_fused_attention_overrideable_backward"}
_IMPLICIT = torch._C.DispatchKey.CompositeImplicitAutograd
KERNEL_NAMESPACE = "tpu::"          # torch.tpu.ops' kernels (tpusim/backend/torchtpu/ops.py): matmuls inside


class ContractionMode(DeviceDispatchMode):
    """On host tensors: every contraction in ``RULES`` at ``precision``, the rest as it is."""

    def __init__(self, precision: str) -> None:
        super().__init__()
        self.precision = precision

    def __torch_dispatch__(self, func: torch._ops.OpOverload, types: object, args: tuple = (),
                           kwargs: dict | None = None) -> object:
        rule = RULES.get(func._schema.name)
        kwargs = kwargs or {}
        if rule is not None:
            return rule(func, args, kwargs, self.precision)
        if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), _IMPLICIT):
            with self:                  # below autograd a composite (matmul, linear, einsum) comes here whole
                return func.decompose(*args, **kwargs)
        return func(*args, **kwargs)


@contextmanager
def _contracting(precision: str) -> Iterator[None]:
    """``ContractionMode`` below a DEFAULT or HIGH precision (HIGHEST: CPU's kernels as they are)."""
    if precision == HIGHEST:
        yield
        return
    # The device's fallback runs with the Python dispatch key excluded (csrc/fallback.cpp PythonKeyOff, as
    # torch.library's Python kernels): a dispatch mode is reached only with it let back in.
    with torch._C._SetExcludeDispatchKeyGuard(torch._C.DispatchKey.Python, False), ContractionMode(precision):
        yield


# ---------------------------------------------------------------- eager ops (the sim target)


def applies(name: str) -> bool:
    """Whether the sim target computes device op ``name`` ("aten::mm") through ``execute`` (the PJRT target
    computes through JAX: a TPU's own numbers where JAX sees one)."""
    return _S.on and (name in ROUTED or name.startswith(KERNEL_NAMESPACE))


def execute(op: torch._ops.OpOverload, plan: fallback.OverloadPlan, host_args: list, host_kwargs: dict,
            kernel: Callable[[torch._ops.OpOverload, fallback.OverloadPlan, list, dict], object]) -> object:
    """One device op on host aliases with its contractions at the precision in effect (``kernel``: the
    sim target's, the CPU kernel or the hand-written one)."""
    precision = _S.precision()
    if precision == HIGHEST:
        return kernel(op, plan, host_args, host_kwargs)
    with _contracting(precision):
        if plan.name.startswith(KERNEL_NAMESPACE):          # its CPU kernel, so its own matmuls meet the mode
            return op._op_dk(torch._C.DispatchKey.CPU, *host_args, **host_kwargs)
        return kernel(op, plan, host_args, host_kwargs)


def _device_overloads() -> list[str]:
    """The plain contractions' overloads (and CPU's flash attention, the op TorchTPU's SDPA choice records) that
    reach the device's fallback (a CPU kernel, no composite one):
    asked of the dispatcher, so another torch's list is found too (mm.out, addmm.out, dot, ... in 2.13)."""
    c, key = torch._C, torch._C.DispatchKey
    composite = (key.CompositeExplicitAutograd, key.CompositeExplicitAutogradNonFunctional,
                 key.CompositeImplicitAutograd, key.PrivateUse1)
    return [full for full in c._dispatch_get_all_op_names()
            if full.startswith("aten::") and (full.removeprefix("aten::").partition(".")[0] in PLAIN
                                               or full in _ATTENTION_RULES)    # TorchTPU's SDPA choice: flash
            and c._dispatch_has_kernel_for_dispatch_key(full, key.CPU)
            and not any(c._dispatch_has_kernel_for_dispatch_key(full, k) for k in composite)]


def _lookup(full: str) -> torch._ops.OpOverload:
    base, _, overload = full.removeprefix("aten::").partition(".")
    return getattr(getattr(aten, base), overload or "default")


def configure(on: bool) -> None:
    """Turn tpu numerics on or off for the device (``DeviceConfig.tpu_numerics``, at registration and
    ``configure``, while no tensor lives): on, the plain contractions come to the Python fallback."""
    if on == _S.on:
        return
    _S.on = on
    if not on:
        if _S.library is not None:
            _S.library._destroy()
            _S.library = None
        return
    library = torch.library.Library("aten", "IMPL")
    for full in _device_overloads():
        op = _lookup(full)
        library.impl(full.removeprefix("aten::"), _to_fallback(op), "PrivateUse1")
    _S.library = library


def _to_fallback(op: torch._ops.OpOverload) -> Callable[..., object]:
    def kernel(*args: object, **kwargs: object) -> object:
        return fallback.fallback(op, *args, **kwargs)
    return kernel


# ---------------------------------------------------------------- compiled graphs


@dataclass(frozen=True)
class GraphNumerics:
    """What a compiled graph computes with: the precision and allow_excess_precision when it compiled."""

    precision: str
    allow_excess: bool

    def run(self, gm: torch.fx.GraphModule, host_args: list) -> list:
        """The graph's outputs (host tensors), its Core ATen ops run on ``host_args`` (see the docstring)."""
        with _contracting(self.precision):
            outs = _HostGraph(gm, self.allow_excess).run(*host_args)
        return list(outs) if isinstance(outs, (tuple, list)) else [outs]


def graph_numerics() -> GraphNumerics | None:
    """The numerics a graph compiled now runs with; None (JAX computes it) when tpu numerics is off or the
    PJRT target is held (``pjrt.enable()``: JAX's device computes, with a TPU's own numbers on a TPU)."""
    if not _S.on or getattr(STATE.target, "name", "sim") != "sim":
        return None
    return GraphNumerics(_S.precision(), _S.allow_excess())


def _on_host(value: object) -> object:
    if isinstance(value, torch.device) and value.type == "tpu":
        return torch.device("cpu")
    if isinstance(value, (list, tuple)):
        return type(value)(_on_host(v) for v in value)
    if isinstance(value, dict):
        return {k: _on_host(v) for k, v in value.items()}
    return value


def _wide(value: object) -> object:
    """A bf16/f16 tensor as f32 (exact); anything else as it is."""
    if isinstance(value, torch.Tensor) and value.dtype in LOW:
        return value.float()
    if isinstance(value, (list, tuple)):
        return type(value)(_wide(v) for v in value)
    return value


class _HostGraph(torch.fx.Interpreter):
    """A Core ATen graph on host tensors (its "tpu" device arguments and tensors read as the host's); with
    ``excess``, every bf16/f16 value it computes is kept in f32 and rounded to its dtype only on the way out."""

    def __init__(self, gm: torch.fx.GraphModule, excess: bool) -> None:
        super().__init__(gm)
        self.excess = excess
        out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
        returned = out.args[0] if isinstance(out.args[0], (tuple, list)) else [out.args[0]]
        self.declared = [n.meta.get("val") if isinstance(n, torch.fx.Node) else None for n in returned]

    def placeholder(self, target: str, args: tuple, kwargs: dict) -> object:
        value = super().placeholder(target, args, kwargs)
        return _wide(value) if self.excess else value

    def get_attr(self, target: str, args: tuple, kwargs: dict) -> object:
        value = super().get_attr(target, args, kwargs)
        if isinstance(value, torch.Tensor) and value.device.type == "tpu":
            value = STATE.shim.host_alias(value)
        return _wide(value) if self.excess else value

    def call_function(self, target: object, args: tuple, kwargs: dict) -> object:
        args, kwargs = _on_host(args), _on_host(kwargs)
        if self.excess and kwargs.get("dtype") in LOW and _reads_float(args):
            kwargs = {**kwargs, "dtype": torch.float32}   # a conversion to bf16 inside the program: dropped
        value = super().call_function(target, args, kwargs)
        return _wide(value) if self.excess else value

    def output(self, target: str, args: tuple, kwargs: dict) -> object:
        value = super().output(target, args, kwargs)
        if not self.excess:
            return value
        outs = value if isinstance(value, (tuple, list)) else [value]
        rounded = [v.to(d.dtype) if isinstance(v, torch.Tensor) and isinstance(d, torch.Tensor) and
                   d.dtype != v.dtype else v for v, d in zip(outs, self.declared, strict=True)]
        return type(value)(rounded) if isinstance(value, (tuple, list)) else rounded[0]


def _reads_float(args: tuple) -> bool:
    return any(isinstance(a, torch.Tensor) and a.is_floating_point() for a in args)
