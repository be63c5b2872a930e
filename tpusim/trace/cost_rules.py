"""The cost formulas of ops whose work depends on their shapes and arguments, over recorded tensor metadata
(torch-free).

A rule takes an op's input and output tensors and its positional arguments and returns its ``Work``: FLOPs,
transcendentals, the MXU matmul shape, and the bytes it moves where those are not simply all inputs read and
all outputs written. Tensors are metadata: anything with ``shape`` (a tuple of ints), ``dtype`` (its name:
"bfloat16", "int64", ...) and ``nbytes`` (``TensorMeta`` as recorded, or ``Meta`` below: what the backend
makes of a torch tensor); non-tensor arguments are plain Python values. Which op uses which rule, its
family and unit are one row each in tpusim/trace/ops.py's ``OPS``; the backend
(tpusim/backend/program_trace/costs.py) only turns torch tensors into metadata, and the validation cases
(tpusim/validate) call ``gemm`` and ``flash_attention`` for the kernels they build by hand, so both count the
same way.

Bytes are logical (numel x itemsize) of the tensors an op reads and writes; gathers read only the rows they
fetch, not the whole table.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

INDEX_DTYPES = ("int64", "int32")


class TensorLike(Protocol):
    shape: tuple[int, ...]
    dtype: str
    nbytes: int


@dataclass(frozen=True)
class Meta:
    """A tensor as the rules read it: its shape, dtype name and bytes per element."""

    shape: tuple[int, ...]
    dtype: str
    itemsize: int

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.itemsize


@dataclass(frozen=True)
class Work:
    """What a rule counts; the op's family (and so its unit) comes from its row in ``tpusim.trace.ops.OPS``."""

    flops: float = 0.0
    transcendentals: float = 0.0
    matmul: tuple[int, int, int, int] | None = None
    bytes_read: float | None = None      # None: all inputs
    bytes_written: float | None = None   # None: all outputs
    dtype: str | None = None             # the dtype whose MXU rate applies; None: the first output's


Rule = Callable[[Sequence[Any], Sequence[Any], tuple], Work]


def numel(t: TensorLike) -> int:
    return math.prod(t.shape)


def itemsize(t: TensorLike) -> int:
    size = getattr(t, "itemsize", None)
    if size is not None:
        return size
    n = numel(t)
    return t.nbytes // n if n else 0


def _index_bytes(ins: Sequence[TensorLike]) -> int:
    return sum(t.nbytes for t in ins if t.dtype in INDEX_DTYPES)


# ---------------------------------------------------------------- MXU: matmuls and convolutions

def gemm(batch: int, m: int, k: int, n: int) -> Work:
    """``batch`` matmuls (m, k) x (k, n): 2 batch m k n FLOPs."""
    return Work(2.0 * batch * m * k * n, matmul=(batch, m, k, n))


def mm(ins: Sequence, outs: Sequence, args: tuple) -> Work:
    a, b = args[0], args[1]
    m, k = a.shape
    n = b.shape[1]
    return gemm(1, m, k, n)


def addmm(ins: Sequence, outs: Sequence, args: tuple) -> Work:
    a, b = args[1], args[2]
    m, k = a.shape
    n = b.shape[1]
    return Work(2.0 * m * k * n + m * n, matmul=(1, m, k, n))


def bmm(ins: Sequence, outs: Sequence, args: tuple) -> Work:
    a, b = args[0], args[1]
    bt, m, k = a.shape
    n = b.shape[2]
    return gemm(bt, m, k, n)


def baddbmm(ins: Sequence, outs: Sequence, args: tuple) -> Work:
    a, b = args[1], args[2]
    bt, m, k = a.shape
    n = b.shape[2]
    return Work(2.0 * bt * m * k * n + bt * m * n, matmul=(bt, m, k, n))


def mv(ins: Sequence, outs: Sequence, args: tuple) -> Work:
    a = args[0] if len(args[0].shape) == 2 else args[1]
    m, k = a.shape
    return Work(2.0 * m * k, matmul=(1, m, k, 1))


def addmv(ins: Sequence, outs: Sequence, args: tuple) -> Work:
    return mv(ins, outs, args[1:])


def dot(ins: Sequence, outs: Sequence, args: tuple) -> Work:
    k = numel(args[0])
    return Work(2.0 * k, matmul=(1, 1, k, 1))


def _quantized(work: Work, a: TensorLike, epilogue_flops: float = 0.0) -> Work:
    """A plain matmul's work at the MXU rate of its input ``a``'s dtype."""
    return Work(work.flops + epilogue_flops, work.transcendentals, work.matmul, dtype=a.dtype)


def int_mm(ins: Sequence, outs: Sequence, args: tuple) -> Work:
    """int8 x int8 -> int32 (``torch._int_mm``): at the chip's int8 MXU rate, not the int32 output's."""
    return _quantized(mm(ins, outs, args), args[0])


def scaled_mm(ins: Sequence, outs: Sequence, args: tuple) -> Work:
    """fp8 x fp8 with per-tensor or per-row scales (``torch._scaled_mm``): the matmul at the fp8 rate; the
    scaling (and an optional bias) is its epilogue, one multiply-add per output element."""
    a, b = args[0], args[1]
    return _quantized(mm(ins, outs, args), a, 2.0 * a.shape[0] * b.shape[1])


def weight_only_mm(ins: Sequence, outs: Sequence, args: tuple) -> Work:
    """Activations x int8/int4 weights stored as [n, k] (``_weight_int8pack_mm``, ``_weight_int4pack_mm``):
    the weights are dequantized to the activations' dtype on the way into the MXU, so the matmul runs at
    the activations' rate and only the weight bytes shrink."""
    a = args[0]
    m, k = a.shape
    n = outs[0].shape[-1]
    return Work(2.0 * m * k * n + m * n, matmul=(1, m, k, n), dtype=a.dtype)


def _conv_dims(inp: TensorLike, weight: TensorLike, out: TensorLike, transposed: bool,
               groups: int) -> tuple[int, int, int, int]:
    """Implicit GEMM (groups, M, K, N) of a convolution."""
    spatial_k = math.prod(weight.shape[2:])
    if not transposed:
        m = out.shape[0] * math.prod(out.shape[2:])
        k = weight.shape[1] * spatial_k
        n = weight.shape[0] // groups
    else:  # each input element is scattered through the kernel
        m = inp.shape[0] * math.prod(inp.shape[2:])
        k = weight.shape[0] // groups
        n = weight.shape[1] * spatial_k
    return groups, m, k, n


def conv(ins: Sequence, outs: Sequence, args: tuple) -> Work:
    inp, weight = args[0], args[1]
    transposed, groups = bool(args[6]), int(args[8])
    g, m, k, n = _conv_dims(inp, weight, outs[0], transposed, groups)
    return Work(2.0 * g * m * k * n, matmul=(g, m, k, n))


def conv_backward(ins: Sequence, outs: Sequence, args: tuple) -> Work:
    grad_out, inp, weight = args[0], args[1], args[2]
    transposed, groups = bool(args[6]), int(args[8])
    mask = args[9] if len(args) > 9 else (True, True, True)
    g, m, k, n = _conv_dims(inp, weight, grad_out, transposed, groups)
    gemms = int(bool(mask[0])) + int(bool(mask[1]))
    return Work(2.0 * g * m * k * n * gemms, matmul=(g * max(gemms, 1), m, k, n))


# ---------------------------------------------------------------- MXU: attention

def causal_fraction(s: int, t: int) -> float:
    """Share of the s x t scores a causal mask keeps (PyTorch's is_causal: query i sees keys 0..i, top-left
    aligned): a flash kernel skips the masked blocks, so the rest is all it computes."""
    if not s or not t:
        return 1.0
    kept = s * (s + 1) / 2 if s <= t else t * (t + 1) / 2 + (s - t) * t      # sum over i of min(i + 1, t)
    return kept / (s * t)


@functools.lru_cache(maxsize=1024)
def window_fraction(s: int, t: int, window: int) -> float:
    """Share of the s x t scores a causal sliding window keeps (query i sees keys max(0, i - w)..min(i, t - 1),
    as torch.tpu.ops.splash_attention masks them)."""
    if not s or not t:
        return 1.0
    kept = sum(max(0, min(i, t - 1) - max(i - window, 0) + 1) for i in range(s))
    return kept / (s * t)


def flash_attention(heads: int, s: int, t: int, dq: int, dv: int, backward: bool, kept: float,
                    group: int = 1) -> Work:
    """Flash attention over ``heads`` (batch x heads) s x t score matrices of which the share ``kept`` is
    computed (a mask's skipped blocks are not): Q, K, V, O and the log-sum-exp go through HBM (the recorded
    tensors), never the scores. Forward: S = QK^T and O = PV (2 matmuls); backward recomputes the scores from
    the log-sum-exp: S = QK^T again, then dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q (5 matmuls). Each
    is score-sized, (s, d) x (d, t) (or (s, t) x (t, d), the same padded work when the head dims are equal);
    plus 5 VPU FLOPs and one exp per kept score (scale, mask, max, sum, ...). Grouped-query attention
    (``group`` query heads a K/V head) stacks a group's queries as the rows of one matmul against their shared
    K/V: the same FLOPs, but a decode step's one-row queries then share each K/V tile's load instead of each
    waiting for it (the MXU's weight-load floor: tpusim/hardware/compute.py)."""
    matmuls, flops_per_score = (5, 2.0 * (3 * dq + 2 * dv)) if backward else (2, 2.0 * (dq + dv))
    scores = heads * s * t * kept
    return Work(scores * (flops_per_score + 5.0), transcendentals=scores,
                matmul=(max(1, round(matmuls * scores / (s * t * group))), s * group, dq, t))


def _flash(q: TensorLike, k: TensorLike, v: TensorLike, causal: bool, backward: bool,
           kept: float | None = None) -> Work:
    *lead, s, d = q.shape
    t = k.shape[-2]
    if kept is None:
        kept = causal_fraction(s, t) if causal else 1.0
    return flash_attention(math.prod(lead), s, t, d, v.shape[-1], backward, kept, query_group(q.shape, k.shape))


def query_group(q: Sequence[int], k: Sequence[int]) -> int:
    """Query heads per K/V head of [..., heads, length, dim] q and k (1 unless grouped-query attention)."""
    if len(q) < 3 or len(k) < 3 or not k[-3] or q[-3] % k[-3]:
        return 1
    return q[-3] // k[-3]


def sdpa(causal_at: int) -> Rule:
    """``_scaled_dot_product_*_attention`` forward, its is_causal at ``causal_at`` in its schema."""
    def rule(ins: Sequence, outs: Sequence, args: tuple) -> Work:
        return _flash(args[0], args[1], args[2], len(args) > causal_at and bool(args[causal_at]), False)
    return rule


def sdpa_backward(causal_at: int) -> Rule:
    """The backward (grad, q, k, v, ...), its is_causal at ``causal_at``."""
    def rule(ins: Sequence, outs: Sequence, args: tuple) -> Work:
        return _flash(args[1], args[2], args[3], len(args) > causal_at and bool(args[causal_at]), True)
    return rule


# TorchTPU's eager flash kernel (torch_tpu's flash_attention_config.h: kDefaultQTileSize = kDefaultKTileSize =
# 512) tiles Q and K in 512-row blocks, a shorter sequence in one block of its length rounded up to 128.
TORCHTPU_FLASH_TILE = 512
TORCHTPU_FLASH_MIN_TILE = 128


def torchtpu_flash_tile(length: int) -> int:
    """The block TorchTPU's eager flash kernel tiles a sequence of ``length`` in."""
    return min(TORCHTPU_FLASH_TILE, -(-max(length, 1) // TORCHTPU_FLASH_MIN_TILE) * TORCHTPU_FLASH_MIN_TILE)


def torchtpu_flash_fraction(s: int, t: int, causal: bool) -> float:
    """Share of the s x t scores TorchTPU's eager flash kernel computes, as a ``kept`` for ``flash_attention``:
    both sequences padded to whole tiles (the padding computed, then masked), and under is_causal every tile with
    a kept score computed in full (the diagonal's too), only the tiles wholly above the diagonal skipped (its
    CreateCausalIfOp). Above 1 where padding outweighs what causal skipping saves (a decode step's one query row
    fills a 128-row tile)."""
    if not s or not t:
        return 1.0
    bq, bk = torchtpu_flash_tile(s), torchtpu_flash_tile(t)
    tiles_q, tiles_k = -(-s // bq), -(-t // bk)
    if causal:
        computed = sum(min(tiles_k, (i * bq + bq - 1) // bk + 1) for i in range(tiles_q))
    else:
        computed = tiles_q * tiles_k
    return computed * bq * bk / (s * t)


def torchtpu_flash(causal_at: int, backward: bool) -> Rule:
    """``_scaled_dot_product_flash_attention_for_cpu`` and its backward: the op an eager SDPA call records where
    TorchTPU's chooser takes its flash kernel (tpusim/backend/csrc/attention.cpp). As that kernel runs: padded
    tiles computed, causal masking skipping whole 512 x 512 tiles only (``torchtpu_flash_fraction``), and
    grouped-query K/V first repeated to every query head through HBM (its builder's ReplicateKV; the backward sums
    dK, dV per group), so no group shares a K/V tile's load."""
    def rule(ins: Sequence, outs: Sequence, args: tuple) -> Work:
        first = 1 if backward else 0
        q, k, v = args[first], args[first + 1], args[first + 2]
        causal = len(args) > causal_at and bool(args[causal_at])
        *lead, s, d = q.shape
        t = k.shape[-2]
        kept = torchtpu_flash_fraction(s, t, causal)
        work = flash_attention(math.prod(lead), s, t, d, v.shape[-1], backward, kept)
        group = query_group(q.shape, k.shape)
        if group == 1:
            return work
        kv_bytes = (numel(k) + numel(v)) * itemsize(k)
        repeated = kv_bytes * group               # the copies written, then read by the kernel in place of K/V
        grads = kv_bytes * group if backward else 0.0     # dK, dV per query head, read back for the group sums
        read = sum(numel(x) * itemsize(x) for x in ins if x is not None) + repeated + grads
        written = sum(numel(x) * itemsize(x) for x in outs if x is not None) + repeated + grads
        return dataclasses.replace(work, bytes_read=read, bytes_written=written)
    return rule


# Score-sized tensors TorchTPU's StableHLO attention writes and reads back through HBM (f32): forward the
# logits (written, read by the softmax) and the probabilities (written, read by P @ V); backward the recomputed
# probabilities, dP and dS, each written and read once.
_UNFUSED_SCORE_PASSES = {False: 4, True: 6}


def unfused_attention(q: TensorLike, k: TensorLike, v: TensorLike, backward: bool,
                      io_bytes: tuple[float, float]) -> Work:
    """TorchTPU's StableHLO "optimized MATH" attention (SDPBackend.OVERRIDEABLE, taken when its flash kernel's
    conditions fail: torch_tpu's scaled_dot_product_attention_shlo.cc): the whole s x t score matrix is computed
    (a causal mask is a select, no block is skipped), grouped K/V broadcast to every query head, bf16/f16 inputs
    promoted to f32 for the whole module when the query needs a gradient (GetSdpaPromotionType's kWholeModule), and
    the scores go through HBM as f32 between XLA's fusions (``_UNFUSED_SCORE_PASSES``), half of them writes.
    ``io_bytes``: the op's recorded inputs and outputs, read and written once."""
    *lead, s, d = q.shape
    t, dv = k.shape[-2], v.shape[-1]
    heads = math.prod(lead)
    matmuls, flops_per_score = (5, 2.0 * (3 * d + 2 * dv)) if backward else (2, 2.0 * (d + dv))
    scores = heads * s * t
    half_scores = scores * 4 * _UNFUSED_SCORE_PASSES[backward] / 2
    return Work(scores * (flops_per_score + 5.0), transcendentals=scores, matmul=(matmuls * heads, s, d, t),
                bytes_read=io_bytes[0] + half_scores, bytes_written=io_bytes[1] + half_scores, dtype="float32")


def sdpa_unfused(backward: bool) -> Rule:
    """``_scaled_dot_product_fused_attention_overrideable`` (q, k, v first) and its backward (grad, q, k, v):
    TorchTPU's StableHLO path, ``unfused_attention``."""
    def rule(ins: Sequence, outs: Sequence, args: tuple) -> Work:
        first = 1 if backward else 0
        io = (sum(numel(x) * itemsize(x) for x in ins if x is not None),
              sum(numel(x) * itemsize(x) for x in outs if x is not None))
        return unfused_attention(args[first], args[first + 1], args[first + 2], backward, io)
    return rule


def splash(backward: bool) -> Rule:
    """TorchTPU's splash attention (``tpu::splash_attention``, ``_backward``): flash attention whose masked
    blocks (causal, sliding window) are skipped; grouped-query K/V are read once, not per query head."""
    def rule(ins: Sequence, outs: Sequence, args: tuple) -> Work:
        q, k, v = args[0], args[1], args[2]
        is_causal, window = bool(args[-2]), int(args[-1])
        kept = window_fraction(q.shape[-2], k.shape[-2], window) if window >= 0 else None
        return _flash(q, k, v, is_causal, backward, kept)
    return rule


def ragged_dot(ins: Sequence, outs: Sequence, args: tuple) -> Work:
    """``tpu::ragged_dot`` (lhs (M, K), rhs (G, K, N)): each of the M rows meets one group's (K, N) weight, so
    2 M K N FLOPs whatever the split (a grouped matmul kernel tiles all M rows; the group sizes are device
    values a static-shape TPU program does not know)."""
    lhs, rhs = args[0], args[1]
    m, k = lhs.shape
    n = rhs.shape[-1]
    return Work(2.0 * m * k * n, matmul=(1, m, k, n))


def ragged_dot_rhs_grad(ins: Sequence, outs: Sequence, args: tuple) -> Work:
    """The weights' gradient (G, K, N) = lhs^T grad per group: again 2 M K N over all M rows."""
    lhs, grad = args[0], args[1]
    m, k = lhs.shape
    n = grad.shape[-1]
    return Work(2.0 * m * k * n, matmul=(1, k, m, n))


# ---------------------------------------------------------------- SparseCore: gathers and scatters

def sparse_dense_matmul(ids_at: int, rows_at: int) -> Rule:
    """A SparseCore embedding lookup (``tpu::sparse_dense_matmul``, ``_csr``): each of the nnz ids fetches one
    table row and adds gain x row to its sample's output: 2 nnz D FLOPs, nnz rows and the ids read, the
    (batch, D) output written."""
    def rule(ins: Sequence, outs: Sequence, args: tuple) -> Work:
        ids, table = args[ids_at], args[rows_at]
        nnz, dim = numel(ids), table.shape[-1]
        return Work(2.0 * nnz * dim, bytes_read=nnz * dim * itemsize(table) + _index_bytes(ins),
                    bytes_written=outs[0].nbytes)
    return rule


def sparse_dense_matmul_grad(ids_at: int) -> Rule:
    """The table's gradient: each of the nnz ids scatters gain x its sample's gradient row into its table row
    (2 nnz D FLOPs, nnz rows read and written: only the touched rows move)."""
    def rule(ins: Sequence, outs: Sequence, args: tuple) -> Work:
        grad, ids = args[0], args[ids_at]
        nnz, dim = numel(ids), grad.shape[-1]
        moved = nnz * dim * itemsize(grad)
        return Work(2.0 * nnz * dim, bytes_read=moved + _index_bytes(ins), bytes_written=moved)
    return rule


def gather(ins: Sequence, outs: Sequence, args: tuple) -> Work:
    """Reads the fetched rows (= the output) and the indices, writes the output."""
    out = sum(o.nbytes for o in outs if o is not None)
    return Work(0.0, bytes_read=out + _index_bytes(ins), bytes_written=out)


def embedding_bag(ins: Sequence, outs: Sequence, args: tuple) -> Work:
    weight, indices = args[0], args[1]
    dim = weight.shape[1]
    looked_up = numel(indices) * dim
    return Work(float(looked_up), bytes_read=looked_up * itemsize(weight) + _index_bytes(ins),
                bytes_written=outs[0].nbytes)


def scatter(ins: Sequence, outs: Sequence, args: tuple) -> Work:
    """Reads the source values and indices, writes that many elements of the destination."""
    src = [t for t in ins[1:] if t.dtype not in INDEX_DTYPES]
    moved = sum(t.nbytes for t in src) if src else sum(o.nbytes for o in outs if o is not None)
    elems = sum(numel(t) for t in src)
    return Work(float(elems), bytes_read=moved + _index_bytes(ins), bytes_written=moved)


# ---------------------------------------------------------------- VPU: counted per element

def per_cube(coefficient: float, in_numels: tuple[int, ...], out_numels: tuple[int, ...]) -> float | None:
    """FLOPs of a dense eigensolver of b n x n matrices (coefficient x b x n^3), n read from the sizes (the
    input is b n^2 elements, the eigenvalues b n); None when they do not read so."""
    values = min(out_numels, default=0)
    if not in_numels or not values or max(in_numels) % values:
        return None
    n = max(in_numels) // values
    return coefficient * (values // n) * n ** 3 if n and values % n == 0 else None
