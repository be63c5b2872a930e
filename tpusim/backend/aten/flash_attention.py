"""Attention in torch.compile'd graphs as one fused op (forward and backward), as XLA's flash kernel on TPU.

Why: Core ATen decomposes ``F.scaled_dot_product_attention`` into bmm + softmax + bmm, and AOT autograd
then saves the s x t probabilities of every call for the backward: a GPT-3 block at sequence 2048 saves
~1 GB per layer that a flash kernel never writes (it keeps the log-sum-exp and recomputes the scores).
``use_fused_attention`` rewrites the Dynamo graph's SDPA calls without dropout (grouped-query attention
included: K and V with fewer heads, each shared by a group of query heads, as a flash kernel reads them),
in the graph and in its activation-checkpointed bodies, into ``tpusim::attention``, whose backward is
``tpusim::attention_backward``: each is one op of the compiled program, lowered to JAX
(tpusim/backend/lowering/nn.py) and priced by the flash-attention cost rule (their rows in
tpusim/trace/ops.py's ``OPS``).
"""

from __future__ import annotations

import operator

import torch
import torch.fx
from torch import Tensor
from torch.nn import functional as F


def _grouped(q: Tensor, kv: Tensor) -> Tensor:
    """K or V with each head repeated for its group of query heads (grouped-query attention)."""
    groups = q.shape[-3] // kv.shape[-3] if q.dim() >= 3 and kv.dim() >= 3 else 1
    return kv.repeat_interleave(groups, dim=-3) if groups > 1 else kv


def _summed(grad: Tensor, kv: Tensor) -> Tensor:
    """A grouped gradient back to K's or V's heads: the sum over each group."""
    if grad.shape == kv.shape:
        return grad
    *lead, heads, t, d = grad.shape
    return grad.reshape(*lead, kv.shape[-3], heads // kv.shape[-3], t, d).sum(-3)


def _scores(q: Tensor, k: Tensor, attn_mask: Tensor | None, is_causal: bool, scale: float | None) -> Tensor:
    s = (q.float() @ k.float().transpose(-1, -2)) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if is_causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else s + attn_mask
    return s


@torch.library.custom_op("tpusim::attention", mutates_args=())
def attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, dropout_p: float, is_causal: bool,
              scale: float | None) -> tuple[Tensor, Tensor]:
    """(output, log-sum-exp of the scores): what a flash kernel writes."""
    s = _scores(q, _grouped(q, k), attn_mask, is_causal, scale)
    return (torch.softmax(s, -1) @ _grouped(q, v).float()).to(v.dtype), torch.logsumexp(s, -1)


@attention.register_fake
def _(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, dropout_p: float, is_causal: bool,
      scale: float | None) -> tuple[Tensor, Tensor]:
    return q.new_empty((*q.shape[:-1], v.shape[-1]), dtype=v.dtype), q.new_empty(q.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("tpusim::attention_backward", mutates_args=())
def attention_backward(grad: Tensor, q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, out: Tensor,
                       lse: Tensor, is_causal: bool, scale: float | None) -> tuple[Tensor, Tensor, Tensor]:
    """dQ, dK, dV from the scores recomputed with the log-sum-exp (no s x t tensor kept between the passes)."""
    kg, vg = _grouped(q, k), _grouped(q, v)
    p = torch.exp(_scores(q, kg, attn_mask, is_causal, scale) - lse.unsqueeze(-1))
    g = grad.float()
    dv = p.transpose(-1, -2) @ g
    dp = g @ vg.float().transpose(-1, -2)
    ds = p * (dp - (g * out.float()).sum(-1, keepdim=True))
    ds = ds * (scale if scale is not None else q.shape[-1] ** -0.5)
    return ((ds @ kg.float()).to(q.dtype), _summed(ds.transpose(-1, -2) @ q.float(), k).to(k.dtype),
            _summed(dv, v).to(v.dtype))


@attention_backward.register_fake
def _(grad: Tensor, q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, out: Tensor, lse: Tensor,
      is_causal: bool, scale: float | None) -> tuple[Tensor, Tensor, Tensor]:
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup(ctx: object, inputs: tuple, output: tuple) -> None:
    q, k, v, attn_mask, _, is_causal, scale = inputs
    ctx.save_for_backward(q, k, v, output[0], output[1])
    ctx.attn_mask, ctx.is_causal, ctx.scale = attn_mask, is_causal, scale


def _backward(ctx: object, grad: Tensor, _grad_lse: Tensor) -> tuple:
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = attention_backward(grad.contiguous(), q, k, v, ctx.attn_mask, out, lse, ctx.is_causal, ctx.scale)
    return dq, dk, dv, None, None, None, None


attention.register_autograd(_backward, setup_context=_setup)

_SDPA = (torch._C._nn.scaled_dot_product_attention, F.scaled_dot_product_attention)
_PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_DEFAULTS = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False}


def use_fused_attention(gm: torch.fx.GraphModule) -> int:
    """Rewrite the Dynamo graph's SDPA calls without dropout into ``tpusim::attention``, in the graph and in
    the bodies of its higher-order ops (activation checkpointing's); returns how many."""
    return sum(_rewrite(module) for module in gm.modules() if isinstance(module, torch.fx.GraphModule))


def _rewrite(gm: torch.fx.GraphModule) -> int:
    rewritten = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _SDPA:
            continue
        bound = {**_DEFAULTS, **dict(zip(_PARAMS, node.args)), **node.kwargs}
        flags = [bound[k] for k in ("dropout_p", "is_causal", "scale", "enable_gqa")]
        if any(isinstance(f, torch.fx.Node) for f in flags) or bound["dropout_p"] != 0.0:
            continue
        with gm.graph.inserting_after(node):
            fused = gm.graph.call_function(torch.ops.tpusim.attention.default, (
                bound["query"], bound["key"], bound["value"], bound["attn_mask"], 0.0, bool(bound["is_causal"]),
                bound["scale"]))
        with gm.graph.inserting_after(fused):
            out = gm.graph.call_function(operator.getitem, (fused, 0))
        out.meta = dict(node.meta)
        node.replace_all_uses_with(out)
        gm.graph.erase_node(node)
        rewritten += 1
    if rewritten:
        gm.graph.lint()
        gm.recompile()
    return rewritten
