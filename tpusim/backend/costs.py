"""Cost rules per op family: an op's FLOPs, transcendentals and bytes (its unit comes with its family).

What an op is (its family: contraction, attention, gather/scatter, data movement, reduction,
elementwise, opaque) is tpusim/trace/ops.py's table; this module only counts the work. Contractions
and attention (MXU) and gathers/scatters (SparseCore) have one formula per op from its shapes
(``_MXU``, ``_SPARSE``); data movement is DMA work with no arithmetic; the rest is counted per
element on the VPU, with transcendental counts (exp, log, tanh, ...) for the ops that need them.
Adding an op's rule = one entry in one of the tables below.
Bytes are logical (numel x itemsize) of the tensors an op reads and writes; gathers read only
the rows they fetch, not the whole table.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from tpusim.trace.ops import FOREACH_PREFIX, Family, base_name, family_of, unit_of


@dataclass(frozen=True)
class OpCost:
    family: Family
    flops: float = 0.0
    transcendentals: float = 0.0
    matmul: tuple[int, int, int, int] | None = None
    bytes_read: float | None = None      # None: all inputs
    bytes_written: float | None = None   # None: all outputs
    dtype: str | None = None             # the dtype whose MXU rate applies; None: the first output's

    @property
    def unit(self) -> str:
        return unit_of(self.family)


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _numel(shape: Sequence[int]) -> int:
    return math.prod(shape)


# ---------------------------------------------------------------- MXU: matmuls and convolutions

def _mm(ins: list, outs: list, args: tuple) -> OpCost:
    a, b = args[0], args[1]
    m, k = a.shape
    n = b.shape[1]
    return OpCost(Family.CONTRACTION, 2.0 * m * k * n, matmul=(1, m, k, n))


def _addmm(ins: list, outs: list, args: tuple) -> OpCost:
    a, b = args[1], args[2]
    m, k = a.shape
    n = b.shape[1]
    return OpCost(Family.CONTRACTION, 2.0 * m * k * n + m * n, matmul=(1, m, k, n))


def _bmm(ins: list, outs: list, args: tuple) -> OpCost:
    a, b = args[0], args[1]
    bt, m, k = a.shape
    n = b.shape[2]
    return OpCost(Family.CONTRACTION, 2.0 * bt * m * k * n, matmul=(bt, m, k, n))


def _baddbmm(ins: list, outs: list, args: tuple) -> OpCost:
    a, b = args[1], args[2]
    bt, m, k = a.shape
    n = b.shape[2]
    return OpCost(Family.CONTRACTION, 2.0 * bt * m * k * n + bt * m * n, matmul=(bt, m, k, n))


def _mv(ins: list, outs: list, args: tuple) -> OpCost:
    a = args[0] if args[0].dim() == 2 else args[1]
    m, k = a.shape
    return OpCost(Family.CONTRACTION, 2.0 * m * k, matmul=(1, m, k, 1))


def _dot(ins: list, outs: list, args: tuple) -> OpCost:
    k = args[0].numel()
    return OpCost(Family.CONTRACTION, 2.0 * k, matmul=(1, 1, k, 1))


def _quantized(cost: OpCost, a: torch.Tensor, epilogue_flops: float = 0.0) -> OpCost:
    """A plain matmul's cost as a quantized contraction at the MXU rate of its input ``a``'s dtype."""
    return replace(cost, family=Family.QUANTIZED_CONTRACTION, flops=cost.flops + epilogue_flops,
                   dtype=str(a.dtype).removeprefix("torch."))


def _int_mm(ins: list, outs: list, args: tuple) -> OpCost:
    """int8 x int8 -> int32 (``torch._int_mm``): at the chip's int8 MXU rate, not the int32 output's."""
    return _quantized(_mm(ins, outs, args), args[0])


def _scaled_mm(ins: list, outs: list, args: tuple) -> OpCost:
    """fp8 x fp8 with per-tensor or per-row scales (``torch._scaled_mm``): the matmul at the fp8 rate; the
    scaling (and an optional bias) is its epilogue, one multiply-add per output element."""
    a, b = args[0], args[1]
    return _quantized(_mm(ins, outs, args), a, 2.0 * a.shape[0] * b.shape[1])


def _weight_only_mm(ins: list, outs: list, args: tuple) -> OpCost:
    """Activations x int8/int4 weights stored as [n, k] (``_weight_int8pack_mm``, ``_weight_int4pack_mm``):
    the weights are dequantized to the activations' dtype on the way into the MXU, so the matmul runs at
    the activations' rate and only the weight bytes shrink."""
    a = args[0]
    m, k = a.shape
    n = outs[0].shape[-1]
    return OpCost(Family.QUANTIZED_CONTRACTION, 2.0 * m * k * n + m * n, matmul=(1, m, k, n),
                dtype=str(a.dtype).removeprefix("torch."))


def _conv_dims(inp: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, transposed: bool,
               groups: int) -> tuple[int, int, int, int]:
    """Implicit GEMM (groups, M, K, N) of a convolution."""
    spatial_k = _numel(weight.shape[2:])
    if not transposed:
        m = out.shape[0] * _numel(out.shape[2:])
        k = weight.shape[1] * spatial_k
        n = weight.shape[0] // groups
    else:  # each input element is scattered through the kernel
        m = inp.shape[0] * _numel(inp.shape[2:])
        k = weight.shape[0] // groups
        n = weight.shape[1] * spatial_k
    return groups, m, k, n


def _conv(ins: list, outs: list, args: tuple) -> OpCost:
    inp, weight = args[0], args[1]
    transposed, groups = bool(args[6]), int(args[8])
    g, m, k, n = _conv_dims(inp, weight, outs[0], transposed, groups)
    return OpCost(Family.CONTRACTION, 2.0 * g * m * k * n, matmul=(g, m, k, n))


def _conv_backward(ins: list, outs: list, args: tuple) -> OpCost:
    grad_out, inp, weight = args[0], args[1], args[2]
    transposed, groups = bool(args[6]), int(args[8])
    mask = args[9] if len(args) > 9 else (True, True, True)
    out_like = grad_out
    g, m, k, n = _conv_dims(inp, weight, out_like, transposed, groups)
    gemms = int(bool(mask[0])) + int(bool(mask[1]))
    return OpCost(Family.CONTRACTION, 2.0 * g * m * k * n * gemms, matmul=(g * max(gemms, 1), m, k, n))


def _causal_fraction(s: int, t: int) -> float:
    """Share of the s x t scores a causal mask keeps (PyTorch's is_causal: query i sees keys 0..i, top-left
    aligned): a flash kernel skips the masked blocks, so the rest is all it computes."""
    if not s or not t:
        return 1.0
    kept = s * (s + 1) / 2 if s <= t else t * (t + 1) / 2 + (s - t) * t      # sum over i of min(i + 1, t)
    return kept / (s * t)


def _flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, matmuls: int,
           matmul_flops_per_score: float, kept: float | None = None) -> OpCost:
    """Flash attention: Q, K, V, O and the log-sum-exp go through HBM (the recorded tensors), never the s x t
    scores; ``matmuls`` score-sized matmuls of shape (s, d) x (d, t) (or (s, t) x (t, d), the same padded
    work when the head dims are equal), 5 VPU FLOPs and one exp per kept score (scale, mask, max, sum, ...)."""
    *lead, s, d = q.shape
    t = k.shape[-2]
    bh = _numel(lead)
    if kept is None:        # the share of the s x t scores computed (a mask's skipped blocks are not)
        kept = _causal_fraction(s, t) if causal else 1.0
    scores = bh * s * t * kept
    return OpCost(Family.ATTENTION, scores * (matmul_flops_per_score + 5.0), transcendentals=scores,
                matmul=(max(1, round(matmuls * scores / (s * t))), s, d, t))


def _sdpa(ins: list, outs: list, args: tuple, causal_at: int) -> OpCost:
    """Forward: S = QK^T and O = PV (2 matmuls)."""
    q, k, v = args[0], args[1], args[2]
    causal = len(args) > causal_at and bool(args[causal_at])
    return _flash(q, k, v, causal, 2, 2.0 * (q.shape[-1] + v.shape[-1]))


def _sdpa_backward(ins: list, outs: list, args: tuple, causal_at: int) -> OpCost:
    """Backward recomputes the scores from the log-sum-exp: S = QK^T again, then dV = P^T dO, dP = dO V^T,
    dQ = dS K, dK = dS^T Q (5 matmuls)."""
    q, k, v = args[1], args[2], args[3]
    causal = len(args) > causal_at and bool(args[causal_at])
    return _flash(q, k, v, causal, 5, 2.0 * (3 * q.shape[-1] + 2 * v.shape[-1]))


def _window_fraction(s: int, t: int, window: int) -> float:
    """Share of the s x t scores a causal sliding window keeps (query i sees keys max(0, i - w)..min(i, t - 1),
    as torch.tpu.ops.splash_attention masks them)."""
    if not s or not t:
        return 1.0
    i = torch.arange(s, dtype=torch.int64)
    kept = (torch.clamp(i, max=t - 1) - torch.clamp(i - window, min=0) + 1).clamp(min=0).sum().item()
    return kept / (s * t)


def _splash(args: tuple, matmuls: int) -> OpCost:
    """TorchTPU's splash attention (``tpu::splash_attention``, ``_backward``): flash attention whose masked
    blocks (causal, sliding window) are skipped; grouped-query K/V are read once, not per query head."""
    q, k, v = args[0], args[1], args[2]
    is_causal, window = bool(args[-2]), int(args[-1])
    flops_per_score = 2.0 * (q.shape[-1] + v.shape[-1]) if matmuls == 2 else 2.0 * (3 * q.shape[-1] + 2 * v.shape[-1])
    kept = _window_fraction(q.shape[-2], k.shape[-2], window) if window >= 0 else None
    return _flash(q, k, v, is_causal, matmuls, flops_per_score, kept)


def _ragged_dot(ins: list, outs: list, args: tuple) -> OpCost:
    """``tpu::ragged_dot`` (lhs (M, K), rhs (G, K, N)): each of the M rows meets one group's (K, N) weight, so
    2 M K N FLOPs whatever the split (a grouped matmul kernel tiles all M rows; the group sizes are device
    values a static-shape TPU program does not know)."""
    lhs, rhs = args[0], args[1]
    m, k = lhs.shape
    n = rhs.shape[-1]
    return OpCost(Family.CONTRACTION, 2.0 * m * k * n, matmul=(1, m, k, n))


def _ragged_dot_rhs_grad(ins: list, outs: list, args: tuple) -> OpCost:
    """The weights' gradient (G, K, N) = lhs^T grad per group: again 2 M K N over all M rows."""
    lhs, grad = args[0], args[1]
    m, k = lhs.shape
    n = grad.shape[-1]
    return OpCost(Family.CONTRACTION, 2.0 * m * k * n, matmul=(1, k, m, n))


def _sparse_dense_matmul(ins: list, outs: list, args: tuple, ids_at: int, rows_at: int) -> OpCost:
    """A SparseCore embedding lookup (``tpu::sparse_dense_matmul``, ``_csr``): each of the nnz ids fetches one
    table row and adds gain x row to its sample's output: 2 nnz D FLOPs, nnz rows and the ids read, the
    (batch, D) output written."""
    ids, table = args[ids_at], args[rows_at]
    nnz, dim = ids.numel(), table.shape[-1]
    index = sum(nbytes(t) for t in ins if t.dtype in (torch.int64, torch.int32))
    return OpCost(Family.GATHER_SCATTER, 2.0 * nnz * dim, bytes_read=nnz * dim * table.element_size() + index,
                bytes_written=nbytes(outs[0]))


def _sparse_dense_matmul_grad(ins: list, outs: list, args: tuple, ids_at: int) -> OpCost:
    """The table's gradient: each of the nnz ids scatters gain x its sample's gradient row into its table row
    (2 nnz D FLOPs, nnz rows read and written: only the touched rows move)."""
    grad, ids = args[0], args[ids_at]
    nnz, dim = ids.numel(), grad.shape[-1]
    moved = nnz * dim * grad.element_size()
    index = sum(nbytes(t) for t in ins if t.dtype in (torch.int64, torch.int32))
    return OpCost(Family.GATHER_SCATTER, 2.0 * nnz * dim, bytes_read=moved + index, bytes_written=moved)


# torch.tpu.ops kernels (torchtpu/ops.py): adding a tpu:: kernel = one row here and one in tpusim/trace/ops.py
_TPU_KERNELS: dict[str, Callable[[list, list, tuple], OpCost]] = {
    "tpu::splash_attention": lambda i, o, a: _splash(a, 2),
    "tpu::splash_attention_backward": lambda i, o, a: _splash(a, 5),
    "tpu::ragged_dot": _ragged_dot,
    "tpu::ragged_dot_rhs_grad": _ragged_dot_rhs_grad,
    "tpu::sparse_dense_matmul": lambda i, o, a: _sparse_dense_matmul(i, o, a, 0, 3),
    "tpu::sparse_dense_matmul_csr": lambda i, o, a: _sparse_dense_matmul(i, o, a, 1, 3),
    "tpu::sparse_dense_matmul_grad": lambda i, o, a: _sparse_dense_matmul_grad(i, o, a, 1),
    "tpu::sparse_dense_matmul_grad_csr": lambda i, o, a: _sparse_dense_matmul_grad(i, o, a, 2),
}


_MXU: dict[str, Callable[[list, list, tuple], OpCost]] = {
    "mm": _mm, "addmm": _addmm, "_addmm_activation": _addmm, "bmm": _bmm, "baddbmm": _baddbmm, "mv": _mv,
    "addmv": lambda i, o, a: _mv(i, o, a[1:]), "dot": _dot, "vdot": _dot,
    "_int_mm": _int_mm, "_scaled_mm": _scaled_mm, "_weight_int8pack_mm": _weight_only_mm,
    "_weight_int4pack_mm": _weight_only_mm,
    "convolution": _conv, "convolution_overrideable": _conv, "_convolution": _conv,
    "convolution_backward": _conv_backward, "convolution_backward_overrideable": _conv_backward,
    # is_causal's position in each schema
    "_scaled_dot_product_flash_attention_for_cpu": lambda i, o, a: _sdpa(i, o, a, 4),
    "_scaled_dot_product_fused_attention_overrideable": lambda i, o, a: _sdpa(i, o, a, 5),
    "_scaled_dot_product_flash_attention_for_cpu_backward": lambda i, o, a: _sdpa_backward(i, o, a, 7),
    "_scaled_dot_product_fused_attention_overrideable_backward": lambda i, o, a: _sdpa_backward(i, o, a, 13),
}


# ---------------------------------------------------------------- SparseCore: gathers and scatters

def _gather_like(ins: list, outs: list, args: tuple) -> OpCost:
    """Reads the fetched rows (= the output) and the indices, writes the output."""
    out = sum(nbytes(o) for o in outs if o is not None)
    index = sum(nbytes(t) for t in ins if t.dtype in (torch.int64, torch.int32))
    return OpCost(Family.GATHER_SCATTER, 0.0, bytes_read=out + index, bytes_written=out)


def _embedding_bag(ins: list, outs: list, args: tuple) -> OpCost:
    weight, indices = args[0], args[1]
    dim = weight.shape[1]
    looked_up = indices.numel() * dim
    index = sum(nbytes(t) for t in ins if t.dtype in (torch.int64, torch.int32))
    return OpCost(Family.GATHER_SCATTER, float(looked_up), bytes_read=looked_up * weight.element_size() + index,
                bytes_written=nbytes(outs[0]))


def _scatter_like(ins: list, outs: list, args: tuple) -> OpCost:
    """Reads the source values and indices, writes that many elements of the destination."""
    src = [t for t in ins[1:] if t.dtype not in (torch.int64, torch.int32)]
    index = sum(nbytes(t) for t in ins if t.dtype in (torch.int64, torch.int32))
    moved = sum(nbytes(t) for t in src) if src else sum(nbytes(o) for o in outs if o is not None)
    elems = sum(t.numel() for t in src)
    return OpCost(Family.GATHER_SCATTER, float(elems), bytes_read=moved + index, bytes_written=moved)


_SPARSE: dict[str, Callable[[list, list, tuple], OpCost]] = {
    "embedding": _gather_like, "index_select": _gather_like, "gather": _gather_like, "index": _gather_like,
    "_unsafe_index": _gather_like, "take": _gather_like, "masked_select": _gather_like,
    "_embedding_bag": _embedding_bag, "_embedding_bag_forward_only": _embedding_bag,
    "embedding_bag": _embedding_bag,
    "embedding_dense_backward": _scatter_like, "_embedding_bag_backward": _scatter_like,
    "_embedding_bag_dense_backward": _scatter_like, "_embedding_bag_per_sample_weights_backward": _scatter_like,
    "scatter": _scatter_like, "scatter_add": _scatter_like, "scatter_reduce": _scatter_like,
    "index_add": _scatter_like, "index_put": _scatter_like, "_index_put_impl": _scatter_like,
    "index_copy": _scatter_like, "index_fill": _scatter_like, "masked_scatter": _scatter_like,
    "_unsafe_index_put": _scatter_like, "embedding_renorm": _scatter_like,
}

# Ops whose cost depends on their shapes and arguments (one formula each); every key is a contraction,
# attention or gather/scatter op in tpusim.trace.ops (tests/test_ops.py checks it).
_SHAPED: dict[str, Callable[[list, list, tuple], OpCost]] = {**_MXU, **_SPARSE, **_TPU_KERNELS}


# ---------------------------------------------------------------- VPU: elementwise and reductions

# transcendental operations per output element
_TRANSCENDENTAL: dict[str, float] = {
    "exp": 1, "exp2": 1, "expm1": 1, "log": 1, "log2": 1, "log10": 1, "log1p": 1, "tanh": 1, "sigmoid": 1,
    "gelu": 1, "gelu_backward": 2, "silu": 1, "silu_backward": 1, "sin": 1, "cos": 1, "tan": 1, "asin": 1,
    "acos": 1, "atan": 1, "atan2": 1, "sinh": 1, "cosh": 1, "asinh": 1, "acosh": 1, "atanh": 1, "erf": 1,
    "erfc": 1, "erfinv": 1, "rsqrt": 1, "sqrt": 1, "pow": 2, "softplus": 2, "softplus_backward": 1,
    "elu": 1, "elu_backward": 1, "selu": 1, "celu": 1, "mish": 3, "mish_backward": 3, "log_sigmoid_forward": 2,
    "log_sigmoid_backward": 1, "reciprocal": 1, "_softmax": 1, "_log_softmax": 1, "logsumexp": 1,
    "_log_softmax_backward_data": 1, "binary_cross_entropy_with_logits": 2, "binary_cross_entropy": 1,
    "logit": 1, "xlogy": 1, "special_xlog1py": 1, "lgamma": 1, "digamma": 1, "polygamma": 1, "sinc": 1,
    "native_dropout": 0, "bernoulli": 1, "normal": 2, "uniform": 0, "exponential": 1,
    # fused RNN cells, per element of their largest output (the gate workspace): 3 sigmoids + 2 tanh
    # over 4H (LSTM), 2 sigmoids + 1 tanh over 5H (GRU); backward needs one tanh per hidden unit (LSTM)
    "_thnn_fused_lstm_cell": 1.25, "_thnn_fused_lstm_cell_backward_impl": 0.25, "_thnn_fused_gru_cell": 0.6,
}
# floating-point operations per output element, where not 1
_FLOPS_PER_ELEMENT: dict[str, float] = {
    "native_layer_norm": 8, "native_layer_norm_backward": 12, "native_batch_norm": 8,
    "_native_batch_norm_legit": 8, "_native_batch_norm_legit_no_training": 4, "native_batch_norm_backward": 12,
    "native_group_norm": 8, "native_group_norm_backward": 12, "_fused_rms_norm": 6, "gelu": 8,
    "gelu_backward": 12, "silu": 4, "silu_backward": 6, "sigmoid": 4, "tanh": 4, "_softmax": 5,
    "_log_softmax": 5, "_softmax_backward_data": 4, "_log_softmax_backward_data": 4, "addcmul": 2,
    "addcdiv": 2, "lerp": 3, "mse_loss": 3, "_fused_adam": 16, "_fused_adamw": 17,
    # fused RNN cells (sigmoid/tanh = 4 FLOPs each, as above; backward rows include the bias-gradient sums)
    "_thnn_fused_lstm_cell": 9, "_thnn_fused_lstm_cell_backward_impl": 7.5, "_thnn_fused_gru_cell": 5,
    "_thnn_fused_gru_cell_backward": 7.33,
}
# dense eigensolvers of an n x n matrix (batch b): FLOPs = coefficient x b x n^3. The Francis QR algorithm
# for the real Schur form costs about 25 n^3 with the Schur vectors (eigenvectors follow from them by a
# triangular solve) and 10 n^3 for the eigenvalues alone: Golub & Van Loan, Matrix Computations (4th ed.),
# section 7.5.6. n is read from the sizes: the input is b n^2 elements, the eigenvalues b n.
_FLOPS_PER_CUBE: dict[str, float] = {
    "linalg_eig": 25.0, "_linalg_eigvals": 10.0,
}


def _cubic(short: str, in_numels: tuple[int, ...], out_numels: tuple[int, ...]) -> float | None:
    """FLOPs of a ``_FLOPS_PER_CUBE`` op, or None when its sizes do not read as b matrices of n x n."""
    values = min(out_numels, default=0)
    if not in_numels or not values or max(in_numels) % values:
        return None
    n = max(in_numels) // values
    return _FLOPS_PER_CUBE[short] * (values // n) * n ** 3 if n and values % n == 0 else None


def op_cost(name: str, ins: list[torch.Tensor], outs: list[torch.Tensor], args: tuple) -> OpCost:
    """The cost of one op from its (device) inputs, outputs and arguments."""
    rule = _SHAPED.get(base_name(name))
    if rule is not None:
        try:
            return rule(ins, outs, args)
        except (AttributeError, IndexError, TypeError, ValueError):
            return OpCost(family_of(name))        # no counted work: fusion runs it alone
    return counted_cost(name, tuple(t.numel() for t in ins), tuple(t.numel() for t in outs if t is not None))


def reads_arguments(name: str) -> bool:
    """Whether the op's cost rule reads its arguments (a shaped rule), not only its tensors' sizes."""
    return base_name(name) in _SHAPED


_COUNTED: dict[tuple, OpCost] = {}       # (name, input sizes, output sizes) -> OpCost: the recorder asks per op


def counted_cost(name: str, in_numels: tuple[int, ...], out_numels: tuple[int, ...]) -> OpCost:
    """The cost of an op without a shaped rule, from the element counts of its (device) inputs and outputs."""
    key = (name, in_numels, out_numels)
    found = _COUNTED.get(key)
    if found is None:
        if len(_COUNTED) > 100_000:     # a program of ever-new shapes: keep the memory bounded
            _COUNTED.clear()
        found = _COUNTED[key] = _counted(name, in_numels, out_numels)
    return found


def _counted(name: str, in_numels: tuple[int, ...], out_numels: tuple[int, ...]) -> OpCost:
    family = family_of(name)
    short = base_name(name)
    if family in (Family.DATA_MOVEMENT, Family.GATHER_SCATTER):
        return OpCost(family)
    if family == Family.REDUCTION:
        elements = max(in_numels, default=0)
    else:
        elements = max(out_numels, default=0)
        if not elements:
            elements = max(in_numels, default=0)
    if short.startswith(FOREACH_PREFIX):
        elements = sum(out_numels) or sum(in_numels)
        short = short[len(FOREACH_PREFIX):]
    flops = elements * _FLOPS_PER_ELEMENT.get(short, 1.0)
    if short in _FLOPS_PER_CUBE:
        flops = _cubic(short, in_numels, out_numels) or flops
    return OpCost(family, float(flops), float(elements * _TRANSCENDENTAL.get(short, 0.0)))
