"""Ops whose CompositeExplicitAutograd kernel would shadow the device's fallback run CPU's own kernel on tpu.

Without an explicit registration, nn.LayerNorm on tpu ran native_layer_norm's composite (a
batch_norm decomposition: about 1 ulp off CPU, recorded as native_batch_norm + addcmul). The
fallback registers itself for every such overload the dispatcher lists (fallback.composite_shadowed),
so these compute exactly what CPU computes and are recorded under their own names.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import tpusim.backend as tb
from tpusim.backend.dispatch import fallback
from tpusim.trace.records import OpRecord


def _forward_backward(module: nn.Module, x: torch.Tensor, device: str) -> tuple[torch.Tensor, ...]:
    module = module.to(device)
    module.zero_grad(set_to_none=True)
    inp = x.detach().to(device).requires_grad_()
    out = module(inp)
    out.backward(torch.linspace(-1, 1, out.numel()).reshape(out.shape).to(device))
    grads = [p.grad.to("cpu", copy=True) for p in module.parameters()]   # copies: the module moves on
    return (out.detach().to("cpu", copy=True), inp.grad.to("cpu", copy=True), *grads)


@pytest.mark.parametrize(("make", "shape", "names"), [
    (lambda: nn.LayerNorm(48), (6, 10, 48), ("aten::native_layer_norm", "aten::native_layer_norm_backward")),
    (lambda: nn.GroupNorm(4, 12), (5, 12, 7), ("aten::native_group_norm", "aten::native_group_norm_backward")),
], ids=["layer_norm", "group_norm"])
def test_norms_equal_cpu_bit_for_bit_and_record_their_names(make: object, shape: tuple, names: tuple) -> None:
    torch.manual_seed(3)
    module = make()
    with torch.no_grad():
        for p in module.parameters():
            p.uniform_(-2, 2)
    x = torch.randn(shape) * 3 + 1
    cpu = _forward_backward(module, x, "cpu")
    with tb.recording() as rec:
        tpu = _forward_backward(module, x, "tpu")
    for a, b in zip(tpu, cpu, strict=True):
        assert torch.equal(a, b)
    ops = [r.op for r in rec.trace.of_kind(OpRecord)]
    for name in names:
        assert name in ops
    assert "aten::native_batch_norm" not in ops and "aten::addcmul" not in ops


def test_the_dispatcher_list_is_registered() -> None:
    shadowed = fallback.composite_shadowed()    # asked again: registered ones now have a tpu kernel
    assert shadowed == []
    for name in ("aten::native_layer_norm", "aten::native_group_norm", "aten::addr", "aten::_stack", "aten::all.dims",
                 "aten::any.dims", "aten::linalg__powsum"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(name, torch._C.DispatchKey.PrivateUse1), name


def test_other_shadowed_ops_equal_cpu() -> None:
    torch.manual_seed(4)
    v, w, m = torch.randn(7), torch.randn(5), torch.randn(7, 5)
    b = torch.rand(4, 6, 3) > 0.3
    pairs = [
        (lambda d: torch.addr(m.to(d), v.to(d), w.to(d), beta=0.5, alpha=1.5)),
        (lambda d: torch._stack([v.to(d), v.to(d) * 2], 1)),
        (lambda d: b.to(d).all(dim=(0, 2))),
        (lambda d: b.to(d).any(dim=(1,))),
    ]
    for fn in pairs:
        assert torch.equal(fn("tpu").cpu(), fn("cpu"))
