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


def _no_op(op: object, a: list, kw: dict) -> None:
    """Streams are synchronous on the simulator: nothing to record."""
    return None


KERNELS: dict[str, Callable[[object, list, dict], object]] = {
    "aten::convolution_overrideable": _convolution,
    "aten::convolution_backward_overrideable": _convolution_backward,
    "aten::record_stream": _no_op,
}
