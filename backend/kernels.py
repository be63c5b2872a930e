"""Hand-written kernels: ops whose CPU kernel is wrong or missing for the device.

Each entry is one line in ``KERNELS``: the op name (``aten::name`` or ``aten::name.overload``)
-> a function ``(op, host_args, host_kwargs) -> result`` run by the fallback on host aliases,
so conversion, device mapping and recording stay shared. Adding a hand-written op = one entry.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

aten = torch.ops.aten


def _convolution(op: object, a: list, kw: dict) -> torch.Tensor:
    """PrivateUse1 convolutions route to convolution_overrideable, which CPU does not implement."""
    return aten.convolution.default(*a, **kw)


def _convolution_backward(op: object, a: list, kw: dict) -> tuple:
    grad_output, inp, weight, stride, padding, dilation, transposed, output_padding, groups, mask = a
    channels = weight.shape[1] * groups if transposed else weight.shape[0]
    return aten.convolution_backward.default(grad_output, inp, weight, [channels], stride, padding, dilation,
                                             transposed, output_padding, groups, mask)


def _reduced_loss_out(op: torch._ops.OpOverload, a: list, kw: dict) -> torch.Tensor:
    """``mse_loss.out``/``smooth_l1_loss.out`` with a reduction: the CPU kernel first resizes ``out`` to
    the elementwise shape (TensorIterator), warning that a 0-dim out "was resized", and then back.
    CUDA never sees this (its functional kernel makes its own output); the tpu device reaches the
    out= form through the composite functional, so compute the functional op and write it into out."""
    out = kw["out"]
    functional = getattr(aten, op._schema.name.removeprefix("aten::")).default
    value = functional(*a, **{k: v for k, v in kw.items() if k != "out"})
    if out.shape != value.shape:          # an out of the wrong shape: resize and warn exactly as CPU does
        return op._op(*a, **kw)
    return out.copy_(value)


def _zeros(op: object, a: list, kw: dict) -> torch.Tensor:
    """Autograd's "efficient zero tensor" (sgn's and other gradients) has bytes but no memory (a null
    data pointer, ZeroTensor key): adopted as device storage it would be read through null. Every
    tpu tensor lives in HBM, so it is materialised as zeros (what XLA-style backends do)."""
    return aten.zeros.default(*a, **kw)


def _no_op(op: object, a: list, kw: dict) -> None:
    """Streams are synchronous on the simulator: nothing to record."""
    return None


KERNELS: dict[str, Callable[[object, list, dict], object]] = {
    "aten::convolution_overrideable": _convolution,
    "aten::convolution_backward_overrideable": _convolution_backward,
    "aten::record_stream": _no_op,
    "aten::_efficientzerotensor": _zeros,
    "aten::mse_loss.out": _reduced_loss_out,
    "aten::smooth_l1_loss.out": _reduced_loss_out,
}
