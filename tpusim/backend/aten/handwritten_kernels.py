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


# ---------------------------------------------------------------- fused RNN cells
#
# On an accelerator ATen's LSTM/GRU cells (nn.LSTM, nn.GRU, their Cell forms, packed or not) compute the
# gate matmuls as separate mm ops and hand the elementwise rest to one fused op, ``_thnn_fused_*_cell``,
# whose only kernels are CUDA's. These compute it on the host from its definition, as the same sequence
# of CPU ops the CPU path runs (ATen's LSTMCell/GRUCell for CPU, and the autograd graph of those ops for
# the backward), on tensors of the same shapes and layouts: a vectorised CPU kernel may round an element
# differently at a row's scalar tail, so layout is part of the definition. A cell on tpu therefore gives
# CPU's bits whenever the gate matmuls do (mm + bias == addmm). Each op is one record in the trace:
# one elementwise kernel, as on a TPU where XLA fuses it. Outputs and workspaces are as CUDA's: the LSTM
# workspace is the activated gates [i|f|g|o], the GRU one [r|z|n|hx|hn + b_hn].
# The shim's C++ fallback runs C++ twins of these four (tpusim/backend/csrc/fallback.cpp native_kernels: a Python
# call per time step was most of a recurrent model's device overhead); these run on the Python path
# (debug eager mode, other targets). A change here is the same change there: the test
# tests/backend/test_fallback_speed_invariants.py compares the two paths bit for bit.

def _arg(a: list, kw: dict, i: int, name: str) -> object:
    return a[i] if i < len(a) else kw.get(name)


def _gates(input_gates: torch.Tensor, hidden_gates: torch.Tensor, input_bias: torch.Tensor | None,
           hidden_bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """What CPU's ``linear_ih(x)`` and ``linear_hh(h)`` return: the gate matmuls plus their biases. The
    hidden one is written in place next, so it is always a fresh tensor, never an input."""
    i_gates = input_gates + input_bias if input_bias is not None else input_gates
    h_gates = hidden_gates + hidden_bias if hidden_bias is not None else hidden_gates.clone()
    return i_gates, h_gates


def _lstm_cell(op: object, a: list, kw: dict) -> tuple:
    """``_thnn_fused_lstm_cell(input_gates, hidden_gates, cx, input_bias, hidden_bias) -> (hy, cy, workspace)``."""
    igates, hgates, cx = a[0], a[1], a[2]
    i_gates, gates = _gates(igates, hgates, _arg(a, kw, 3, "input_bias"), _arg(a, kw, 4, "hidden_bias"))
    gates.add_(i_gates)
    ingate, forgetgate, cellgate, outgate = gates.unsafe_chunk(4, 1)
    ingate.sigmoid_()
    forgetgate.sigmoid_()
    cellgate.tanh_()
    outgate.sigmoid_()
    cy = (forgetgate * cx).add_(ingate * cellgate)
    hy = outgate * cy.tanh()
    return hy, cy, gates


def _lstm_cell_backward(op: object, a: list, kw: dict) -> tuple:
    """``_thnn_fused_lstm_cell_backward_impl(grad_hy, grad_cy, cx, cy, workspace, has_bias)
    -> (grad_gates, grad_cx, grad_bias)``: CPU autograd's steps through the forward above."""
    grad_hy, grad_cy, cx, cy, workspace, has_bias = a[:6]
    if grad_hy is None and grad_cy is None:
        return None, None, None
    ingate, forgetgate, cellgate, outgate = workspace.unsafe_chunk(4, 1)
    grad_out = None
    if grad_hy is not None:                      # hy = outgate * tanh(cy)
        tanh_cy = cy.tanh()
        grad_out = grad_hy * tanh_cy
        grad_c = aten.tanh_backward(grad_hy * outgate, tanh_cy)
        grad_cy = grad_c if grad_cy is None else grad_cy + grad_c
    grad_cx = grad_cy * forgetgate               # cy = forgetgate * cx + ingate * cellgate
    grads = [aten.sigmoid_backward(grad_cy * cellgate, ingate),
             aten.sigmoid_backward(grad_cy * cx, forgetgate),
             aten.tanh_backward(grad_cy * ingate, cellgate),
             aten.sigmoid_backward(grad_out, outgate) if grad_out is not None else torch.zeros_like(grad_cx)]
    grad_gates = torch.cat(grads, 1)
    return grad_gates, grad_cx, grad_gates.sum(0) if has_bias else None


def _gru_cell(op: object, a: list, kw: dict) -> tuple:
    """``_thnn_fused_gru_cell(input_gates, hidden_gates, hx, input_bias, hidden_bias) -> (hy, workspace)``."""
    igates, hgates, hx = a[0], a[1], a[2]
    i_gates, h_gates = _gates(igates, hgates, _arg(a, kw, 3, "input_bias"), _arg(a, kw, 4, "hidden_bias"))
    i_r, i_z, i_n = i_gates.unsafe_chunk(3, 1)
    h_r, h_z, h_n = h_gates.unsafe_chunk(3, 1)
    resetgate = h_r.add_(i_r).sigmoid_()
    inputgate = h_z.add_(i_z).sigmoid_()
    h_n_biased = h_n.clone()
    newgate = i_n.add(h_n.mul_(resetgate)).tanh_()
    hy = (hx - newgate).mul_(inputgate).add_(newgate)
    return hy, torch.cat([resetgate, inputgate, newgate, hx, h_n_biased], 1)


def _gru_cell_backward(op: object, a: list, kw: dict) -> tuple:
    """``_thnn_fused_gru_cell_backward(grad_hy, workspace, has_bias) -> (grad_input_gates,
    grad_hidden_gates, grad_hx, grad_input_bias, grad_hidden_bias)``: CPU autograd's steps through the
    forward above (hy = (hx - n) * z + n; n = tanh(i_n + h_n * r))."""
    grad_hy, workspace, has_bias = a[:3]
    resetgate, inputgate, newgate, hx, h_n = workspace.unsafe_chunk(5, 1)
    newgate = newgate.contiguous()               # CPU's tanh_backward reads n as a whole tensor: same layout
    grad_hx = grad_hy * inputgate
    grad_z = aten.sigmoid_backward(grad_hy * (hx - newgate), inputgate)
    grad_pre_n = aten.tanh_backward(grad_hy + grad_hx.neg(), newgate)     # n's two uses, then tanh
    grad_r = aten.sigmoid_backward(grad_pre_n * h_n, resetgate)
    grad_input_gates = torch.cat([grad_r, grad_z, grad_pre_n], 1)
    grad_hidden_gates = torch.cat([grad_r, grad_z, grad_pre_n * resetgate], 1)
    if not has_bias:
        return grad_input_gates, grad_hidden_gates, grad_hx, None, None
    return grad_input_gates, grad_hidden_gates, grad_hx, grad_input_gates.sum(0), grad_hidden_gates.sum(0)


def _no_op(op: object, a: list, kw: dict) -> None:
    """Streams are synchronous on the simulator: nothing to record."""
    return None


def _fused_attention(op: object, a: list, kw: dict) -> tuple:
    """``_scaled_dot_product_fused_attention_overrideable``: the one attention op PyTorch calls on a PrivateUse1
    device whose SDPA chooser answers "overrideable" (tpusim/backend/csrc/attention.cpp, only where CPU would use its
    flash kernel), run as CPU's flash kernel so values equal CPU's. Returns the op's nine results: output and
    log-sum-exp, then what only CUDA's varlen kernels fill (empty)."""
    query, key, value = a[0], a[1], a[2]
    out, logsumexp = aten._scaled_dot_product_flash_attention_for_cpu.default(
        query, key, value, _arg(a, kw, 4, "dropout_p") or 0.0, bool(_arg(a, kw, 5, "is_causal")),
        attn_mask=_arg(a, kw, 3, "attn_bias"), scale=kw.get("scale"))
    empty = query.new_empty(0)
    return out, logsumexp, empty, empty, query.shape[-2], key.shape[-2], empty, empty, empty


def _fused_attention_backward(op: object, a: list, kw: dict) -> tuple:
    """Its backward: CPU's flash backward (which recomputes the scores from the log-sum-exp); no gradient for
    the attention mask, as CPU's flash path gives none."""
    grad_out, query, key, value, attn_bias = a[:5]
    out, logsumexp, dropout_p, is_causal = a[6], a[7], a[12], a[13]
    bias = attn_bias if isinstance(attn_bias, torch.Tensor) and attn_bias.numel() else None
    grads = aten._scaled_dot_product_flash_attention_for_cpu_backward.default(
        grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, attn_mask=bias, scale=kw.get("scale"))
    return (*grads, None)


def _out_dtype_matmul(op: torch._ops.OpOverload, a: list, kw: dict) -> torch.Tensor:
    """``mm/bmm/addmm/baddbmm.dtype`` (``torch.bmm(a, b, out_dtype=torch.float32)``): low-precision inputs
    accumulated and returned in ``out_dtype``, as a TPU's MXU does. CPU has no kernel for them (CUDA and
    TorchTPU do): computed as the plain op on the inputs widened to ``out_dtype``."""
    schema_args = [arg.name for arg in op._schema.arguments]
    out_dtype = kw.pop("out_dtype") if "out_dtype" in kw else a.pop(schema_args.index("out_dtype"))
    plain = getattr(aten, op._schema.name.removeprefix("aten::")).default
    widened = [t.to(out_dtype) if isinstance(t, torch.Tensor) else t for t in a]
    return plain(*widened, **kw)


_UNSIGNED_WIDE = (torch.uint16, torch.uint32, torch.uint64)


def _arange_out(op: torch._ops.OpOverload, a: list, kw: dict) -> torch.Tensor:
    """``torch.arange(n, dtype=torch.uint32)``: TorchTPU makes it (TorchTPU's own quantised-sum notebook does), CPU
    has no kernel for uint16/32/64; counted in int64 and converted, the values are the same."""
    out = kw["out"]
    if out.dtype not in _UNSIGNED_WIDE:
        return op(*a, **kw)
    values = aten.arange.start_out(*a, out=torch.empty(0, dtype=torch.int64))
    out.resize_(values.shape)
    return out.copy_(values)


KERNELS: dict[str, Callable[[object, list, dict], object]] = {
    "aten::arange.start_out": _arange_out,
    "aten::mm.dtype": _out_dtype_matmul,
    "aten::bmm.dtype": _out_dtype_matmul,
    "aten::addmm.dtype": _out_dtype_matmul,
    "aten::baddbmm.dtype": _out_dtype_matmul,
    "aten::convolution_overrideable": _convolution,
    "aten::convolution_backward_overrideable": _convolution_backward,
    "aten::record_stream": _no_op,
    "aten::_efficientzerotensor": _zeros,
    "aten::mse_loss.out": _reduced_loss_out,
    "aten::smooth_l1_loss.out": _reduced_loss_out,
    "aten::_thnn_fused_lstm_cell": _lstm_cell,
    "aten::_thnn_fused_lstm_cell_backward_impl": _lstm_cell_backward,
    "aten::_thnn_fused_gru_cell": _gru_cell,
    "aten::_thnn_fused_gru_cell_backward": _gru_cell_backward,
    "aten::_scaled_dot_product_fused_attention_overrideable": _fused_attention,
    "aten::_scaled_dot_product_fused_attention_overrideable_backward": _fused_attention_backward,
}
