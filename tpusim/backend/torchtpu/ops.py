"""``torch.tpu.ops``: TorchTPU's TPU kernels that matter for cost, each one op with CPU numerics.

    out = torch.tpu.ops.splash_attention(q, k, v, is_causal=True)         # also splash_sdpa (TorchTPU's name)
    y = torch.tpu.ops.ragged_dot(x, experts, group_sizes)                  # grouped matmul (MoE)
    emb = torch.tpu.ops.sparse_dense_matmul_csr(row_pointers, ids, gains, table)   # SparseCore lookup

Each kernel is one custom op in the ``tpu`` namespace (``tpu::splash_attention``, ...), so the device
records it as one ``OpRecord`` and the simulator prices it with the op's own cost rule (its row in
tpusim/trace/ops.py: its family and its FLOPs and bytes), not as the dozens of ops a composite would be.
Its CPU kernel computes the values, on the host memory of tpu tensors (the device's fallback runs it) or
on CPU tensors, so ``torch.tpu.ops.X`` on tpu equals ``torch.tpu.ops.X`` on CPU bit for bit. Each has a
shape function (shape-only mode, torch.compile tracing) and a backward (another ``tpu::`` op).

Semantics follow TorchTPU / JAX where the public source has them:

- ``splash_attention(q, k, v, *, scale=None, is_causal=True, local_window_size=None, enable_gqa=False,
  **block_sizes)``: q (B, Hq, S, D), k and v (B, Hkv, T, D) with Hkv dividing Hq (grouped-query when
  smaller); ``local_window_size`` w keeps keys i-w..i (sliding window); block sizes are accepted and
  change nothing (they tile the Pallas kernel). TorchTPU: torch_tpu/ops/splash_attention.py ``splash_sdpa``.
- ``ragged_dot(lhs, rhs, group_sizes)``: ``jax.lax.ragged_dot``: lhs (M, K), rhs (G, K, N), group g
  multiplies the next group_sizes[g] rows of lhs by rhs[g]; rows past the sum of group_sizes are 0.
- ``sparse_dense_matmul(embedding_ids, sample_ids, gains, table, batch_size)``: the SparseCore's
  embedding lookup in COO form: out[sample_ids[i]] += gains[i] * table[embedding_ids[i]], out (batch, D);
  ``sparse_dense_matmul_csr(row_pointers, embedding_ids, gains, table)`` the same in CSR form (sample b owns
  entries row_pointers[b]..row_pointers[b+1]); ``sparse_dense_matmul_grad(...)`` the table's gradient.
  TorchTPU's exact signatures for these are not in its public copy; these follow the SparseCore
  primitives' names and arguments (jax_tpu_embedding ``sparse_dense_matmul_csr``).
- ``optimization_barrier(*tensors)``: XLA's barrier; returns its arguments (pending fused work runs first).

Names TorchTPU lists that tpusim does not provide raise a TpusimError saying why (unsupported.py).
"""

from __future__ import annotations

import importlib
import math

import torch

from tpusim.backend.plumbing.import_hooks import after_import
from tpusim.backend.targets import flush_pending
from tpusim.backend.torchtpu import unsupported
from tpusim.errors import TpusimError

NAMESPACE = "tpu"


# ---------------------------------------------------------------- splash attention


def _attention_mask(s: int, t: int, is_causal: bool, window: int, device: torch.device) -> torch.Tensor | None:
    """True where query i may attend key j (None: everywhere)."""
    if not is_causal and window < 0:
        return None
    i = torch.arange(s, device=device).unsqueeze(1)
    j = torch.arange(t, device=device).unsqueeze(0)
    keep = j <= i if is_causal or window >= 0 else torch.ones(s, t, dtype=torch.bool, device=device)
    if window >= 0:
        keep = keep & (j >= i - window)
    return keep


def _expand_kv(x: torch.Tensor, heads: int) -> torch.Tensor:
    return x if x.shape[1] == heads else x.repeat_interleave(heads // x.shape[1], dim=1)


@torch.library.custom_op(f"{NAMESPACE}::splash_attention", mutates_args=(), device_types="cpu")
def _splash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, is_causal: bool,
            window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention in f32: (out in q's dtype, logsumexp (B, Hq, S) in f32)."""
    heads = q.shape[1]
    qf, kf, vf = q.float(), _expand_kv(k, heads).float(), _expand_kv(v, heads).float()
    scores = (qf * scale) @ kf.transpose(-1, -2)
    keep = _attention_mask(q.shape[-2], k.shape[-2], is_causal, window, q.device)
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse.unsqueeze(-1))
    return (probs @ vf).to(q.dtype), lse


@_splash.register_fake
def _(q, k, v, scale, is_causal, window):
    return torch.empty_like(q), q.new_empty(q.shape[:-1], dtype=torch.float32)


@torch.library.custom_op(f"{NAMESPACE}::splash_attention_backward", mutates_args=(), device_types="cpu")
def _splash_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                     grad: torch.Tensor, scale: float, is_causal: bool,
                     window: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv from the saved output and logsumexp (no second forward), grouped heads summed back."""
    heads, kv_heads = q.shape[1], k.shape[1]
    qf, kf, vf = q.float(), _expand_kv(k, heads).float(), _expand_kv(v, heads).float()
    g, o = grad.float(), out.float()
    scores = (qf * scale) @ kf.transpose(-1, -2)
    keep = _attention_mask(q.shape[-2], k.shape[-2], is_causal, window, q.device)
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    probs = torch.exp(scores - lse.unsqueeze(-1))
    dv = probs.transpose(-1, -2) @ g
    dp = g @ vf.transpose(-1, -2)
    ds = probs * (dp - (g * o).sum(-1, keepdim=True))
    dq = (ds @ kf) * scale
    dk = (ds.transpose(-1, -2) @ qf) * scale
    if kv_heads != heads:
        group = heads // kv_heads
        dk = dk.unflatten(1, (kv_heads, group)).sum(2)
        dv = dv.unflatten(1, (kv_heads, group)).sum(2)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


@_splash_backward.register_fake
def _(q, k, v, out, lse, grad, scale, is_causal, window):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _splash_setup(ctx, inputs, output):
    q, k, v, scale, is_causal, window = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.args = (scale, is_causal, window)


def _splash_grad(ctx, grad_out, grad_lse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = torch.ops.tpu.splash_attention_backward(q, k, v, out, lse, grad_out.contiguous(), *ctx.args)
    return dq, dk, dv, None, None, None


_splash.register_autograd(_splash_grad, setup_context=_splash_setup)


def splash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float | None = None,
                     is_causal: bool = True, local_window_size: int | None = None, enable_gqa: bool = False,
                     **block_sizes: object) -> torch.Tensor:
    """Splash attention (see the module docstring); returns (B, Hq, S, D) in q's dtype."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise TpusimError(f"torch.tpu.ops.splash_attention: q, k, v must be (batch, heads, seq, head_dim); got "
                          f"{list(q.shape)}, {list(k.shape)}, {list(v.shape)}")
    if q.shape[1] % k.shape[1] or k.shape[1] != v.shape[1] or k.shape[-2] != v.shape[-2]:
        raise TpusimError(f"torch.tpu.ops.splash_attention: k and v need the same heads and length, and their "
                          f"heads must divide q's; got q {list(q.shape)}, k {list(k.shape)}, v {list(v.shape)}")
    if local_window_size is not None and (not isinstance(local_window_size, int) or local_window_size < 0):
        raise TpusimError(f"torch.tpu.ops.splash_attention: local_window_size={local_window_size!r}; "
                          f"accepted: None or a whole number >= 0")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    window = -1 if local_window_size is None else local_window_size
    out, _ = _splash(q, k, v, scale, bool(is_causal), window)
    return out


splash_sdpa = splash_attention


def _traceable_by_dynamo(dynamo: object) -> None:
    """Dynamo skips tpusim's files (tpusim/backend/torch_compile/jax_backend.py), so a compiled layer calling a kernel
    here would break its graph (fullgraph=True fails): once Dynamo is imported, the public wrappers are the same
    functions under its ``dont_skip_tracing``, and the graph holds the kernel's op."""
    global splash_attention, splash_sdpa
    splash_attention = splash_sdpa = dynamo.dont_skip_tracing(_splash_wrapper)


_splash_wrapper = splash_attention
after_import("torch._dynamo", _traceable_by_dynamo)
after_import("tpusim.backend.lowering.nn", lambda _: importlib.import_module("tpusim.backend.torchtpu.lowerings"))


# ---------------------------------------------------------------- ragged_dot (grouped matmul)


def _offsets(group_sizes: torch.Tensor) -> list[int]:
    sizes = [int(n) for n in group_sizes.tolist()]
    return [sum(sizes[:g]) for g in range(len(sizes) + 1)]


@torch.library.custom_op(f"{NAMESPACE}::ragged_dot", mutates_args=(), device_types="cpu")
def _ragged_dot(lhs: torch.Tensor, rhs: torch.Tensor, group_sizes: torch.Tensor) -> torch.Tensor:
    out = lhs.new_zeros(lhs.shape[0], rhs.shape[-1], dtype=torch.promote_types(lhs.dtype, rhs.dtype))
    bounds = _offsets(group_sizes)
    for g in range(rhs.shape[0]):
        start, stop = bounds[g], bounds[g + 1]
        if stop > start:
            out[start:stop] = lhs[start:stop] @ rhs[g]
    return out


@_ragged_dot.register_fake
def _(lhs, rhs, group_sizes):
    return lhs.new_empty(lhs.shape[0], rhs.shape[-1], dtype=torch.promote_types(lhs.dtype, rhs.dtype))


@torch.library.custom_op(f"{NAMESPACE}::ragged_dot_rhs_grad", mutates_args=(), device_types="cpu")
def _ragged_dot_rhs_grad(lhs: torch.Tensor, grad: torch.Tensor, group_sizes: torch.Tensor,
                         num_groups: int) -> torch.Tensor:
    """rhs's gradient: group g's rows of lhs transposed times the same rows of grad, (G, K, N)."""
    out = lhs.new_zeros(num_groups, lhs.shape[1], grad.shape[1])
    bounds = _offsets(group_sizes)
    for g in range(num_groups):
        start, stop = bounds[g], bounds[g + 1]
        if stop > start:
            out[g] = lhs[start:stop].transpose(0, 1) @ grad[start:stop]
    return out


@_ragged_dot_rhs_grad.register_fake
def _(lhs, grad, group_sizes, num_groups):
    return lhs.new_empty(num_groups, lhs.shape[1], grad.shape[1])


def _ragged_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _ragged_grad(ctx, grad):
    lhs, rhs, group_sizes = ctx.saved_tensors
    grad = grad.contiguous()
    d_lhs = torch.ops.tpu.ragged_dot(grad, rhs.transpose(1, 2).contiguous(), group_sizes) \
        if ctx.needs_input_grad[0] else None
    d_rhs = torch.ops.tpu.ragged_dot_rhs_grad(lhs, grad, group_sizes, rhs.shape[0]) \
        if ctx.needs_input_grad[1] else None
    return (d_lhs.to(lhs.dtype) if d_lhs is not None else None,
            d_rhs.to(rhs.dtype) if d_rhs is not None else None, None)


_ragged_dot.register_autograd(_ragged_grad, setup_context=_ragged_setup)


def ragged_dot(lhs: torch.Tensor, rhs: torch.Tensor, group_sizes: torch.Tensor, *,
               preferred_element_type: torch.dtype | None = None, precision: object = None) -> torch.Tensor:
    """``jax.lax.ragged_dot`` (see the module docstring); ``precision`` is torch.tpu.precision's business."""
    if lhs.dim() != 2 or rhs.dim() != 3 or group_sizes.dim() != 1 or group_sizes.shape[0] != rhs.shape[0] \
            or lhs.shape[1] != rhs.shape[1] or group_sizes.dtype.is_floating_point:
        raise TpusimError(f"torch.tpu.ops.ragged_dot: expected lhs (M, K), rhs (G, K, N), integer group_sizes (G,); "
                          f"got {list(lhs.shape)}, {list(rhs.shape)}, {list(group_sizes.shape)} {group_sizes.dtype}")
    out = _ragged_dot(lhs, rhs, group_sizes)
    return out if preferred_element_type is None else out.to(preferred_element_type)


# ---------------------------------------------------------------- SparseCore: sparse x dense (embedding lookups)


def _lookup(table: torch.Tensor, embedding_ids: torch.Tensor, sample_ids: torch.Tensor, gains: torch.Tensor,
            batch: int) -> torch.Tensor:
    rows = table.index_select(0, embedding_ids.long()) * gains.to(table.dtype).unsqueeze(1)
    return table.new_zeros(batch, table.shape[1]).index_add_(0, sample_ids.long(), rows)


def _table_grad(grad: torch.Tensor, embedding_ids: torch.Tensor, sample_ids: torch.Tensor, gains: torch.Tensor,
                num_rows: int) -> torch.Tensor:
    rows = grad.index_select(0, sample_ids.long()) * gains.to(grad.dtype).unsqueeze(1)
    return grad.new_zeros(num_rows, grad.shape[1]).index_add_(0, embedding_ids.long(), rows)


@torch.library.custom_op(f"{NAMESPACE}::sparse_dense_matmul", mutates_args=(), device_types="cpu")
def _sdmm(embedding_ids: torch.Tensor, sample_ids: torch.Tensor, gains: torch.Tensor, table: torch.Tensor,
          batch_size: int) -> torch.Tensor:
    return _lookup(table, embedding_ids, sample_ids, gains, batch_size)


@_sdmm.register_fake
def _(embedding_ids, sample_ids, gains, table, batch_size):
    return table.new_empty(batch_size, table.shape[1])


@torch.library.custom_op(f"{NAMESPACE}::sparse_dense_matmul_grad", mutates_args=(), device_types="cpu")
def _sdmm_grad(activation_gradients: torch.Tensor, embedding_ids: torch.Tensor, sample_ids: torch.Tensor,
               gains: torch.Tensor, num_rows: int) -> torch.Tensor:
    return _table_grad(activation_gradients, embedding_ids, sample_ids, gains, num_rows)


@_sdmm_grad.register_fake
def _(activation_gradients, embedding_ids, sample_ids, gains, num_rows):
    return activation_gradients.new_empty(num_rows, activation_gradients.shape[1])


def _sdmm_setup(ctx, inputs, output):
    embedding_ids, sample_ids, gains, table, _ = inputs
    ctx.save_for_backward(embedding_ids, sample_ids, gains)
    ctx.num_rows = table.shape[0]


def _sdmm_backward(ctx, grad):
    embedding_ids, sample_ids, gains = ctx.saved_tensors
    d_table = torch.ops.tpu.sparse_dense_matmul_grad(grad.contiguous(), embedding_ids, sample_ids, gains, ctx.num_rows)
    return None, None, None, d_table, None


_sdmm.register_autograd(_sdmm_backward, setup_context=_sdmm_setup)


def _csr_samples(row_pointers: torch.Tensor) -> torch.Tensor:
    counts = row_pointers[1:] - row_pointers[:-1]
    return torch.repeat_interleave(torch.arange(counts.numel(), device=row_pointers.device), counts.long())


@torch.library.custom_op(f"{NAMESPACE}::sparse_dense_matmul_csr", mutates_args=(), device_types="cpu")
def _sdmm_csr(row_pointers: torch.Tensor, embedding_ids: torch.Tensor, gains: torch.Tensor,
              table: torch.Tensor) -> torch.Tensor:
    n = int(row_pointers[-1])
    return _lookup(table, embedding_ids[:n], _csr_samples(row_pointers), gains[:n], row_pointers.numel() - 1)


@_sdmm_csr.register_fake
def _(row_pointers, embedding_ids, gains, table):
    return table.new_empty(row_pointers.shape[0] - 1, table.shape[1])


@torch.library.custom_op(f"{NAMESPACE}::sparse_dense_matmul_grad_csr", mutates_args=(), device_types="cpu")
def _sdmm_csr_grad(activation_gradients: torch.Tensor, row_pointers: torch.Tensor, embedding_ids: torch.Tensor,
                   gains: torch.Tensor, num_rows: int) -> torch.Tensor:
    n = int(row_pointers[-1])
    return _table_grad(activation_gradients, embedding_ids[:n], _csr_samples(row_pointers), gains[:n], num_rows)


@_sdmm_csr_grad.register_fake
def _(activation_gradients, row_pointers, embedding_ids, gains, num_rows):
    return activation_gradients.new_empty(num_rows, activation_gradients.shape[1])


def _csr_setup(ctx, inputs, output):
    row_pointers, embedding_ids, gains, table = inputs
    ctx.save_for_backward(row_pointers, embedding_ids, gains)
    ctx.num_rows = table.shape[0]


def _csr_backward(ctx, grad):
    row_pointers, embedding_ids, gains = ctx.saved_tensors
    d_table = torch.ops.tpu.sparse_dense_matmul_grad_csr(grad.contiguous(), row_pointers, embedding_ids, gains,
                                                         ctx.num_rows)
    return None, None, None, d_table


_sdmm_csr.register_autograd(_csr_backward, setup_context=_csr_setup)


def _check_ids(where: str, table: torch.Tensor, *ids: torch.Tensor) -> None:
    if table.dim() != 2 or any(t.dim() != 1 or t.dtype.is_floating_point for t in ids):
        raise TpusimError(f"torch.tpu.ops.{where}: expected a table (rows, dim) and 1-D integer ids; got table "
                          f"{list(table.shape)} and ids {[(list(t.shape), str(t.dtype)) for t in ids]}")


def sparse_dense_matmul(embedding_ids: torch.Tensor, sample_ids: torch.Tensor, gains: torch.Tensor,
                        table: torch.Tensor, batch_size: int) -> torch.Tensor:
    """SparseCore lookup in COO form (see the module docstring): (batch_size, dim)."""
    _check_ids("sparse_dense_matmul", table, embedding_ids, sample_ids)
    return _sdmm(embedding_ids, sample_ids, gains, table, int(batch_size))


def sparse_dense_matmul_csr(row_pointers: torch.Tensor, embedding_ids: torch.Tensor, gains: torch.Tensor,
                            table: torch.Tensor) -> torch.Tensor:
    """SparseCore lookup in CSR form (see the module docstring): (len(row_pointers) - 1, dim)."""
    _check_ids("sparse_dense_matmul_csr", table, row_pointers, embedding_ids)
    return _sdmm_csr(row_pointers, embedding_ids, gains, table)


def sparse_dense_matmul_grad(activation_gradients: torch.Tensor, embedding_ids: torch.Tensor,
                             sample_ids: torch.Tensor, gains: torch.Tensor, num_rows: int) -> torch.Tensor:
    """The table's gradient of ``sparse_dense_matmul``: (num_rows, dim)."""
    return _sdmm_grad(activation_gradients, embedding_ids, sample_ids, gains, int(num_rows))


def sparse_gather(table: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Rows of ``table`` (an embedding lookup; priced as a SparseCore gather)."""
    return torch.nn.functional.embedding(indices, table)


def optimization_barrier(*tensors: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """XLA's optimization barrier: nothing fuses across it. Returns its arguments (one, or a tuple)."""
    flush_pending("opaque")
    return tensors[0] if len(tensors) == 1 else tensors


__getattr__ = unsupported.module_getattr("torch.tpu.ops")

__all__ = ["optimization_barrier", "ragged_dot", "sparse_dense_matmul", "sparse_dense_matmul_csr",
           "sparse_dense_matmul_grad", "sparse_gather", "splash_attention", "splash_sdpa"]
