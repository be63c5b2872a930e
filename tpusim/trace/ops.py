"""What an op is and what it costs: its base name, its family (and so its unit) and its cost rule, one row
each in one table, ``OPS`` (torch-free).

Why one table: the cost rules (how FLOPs, transcendentals and bytes are counted), fusion
(tpusim/eager/fusion.py: what may fuse with what), the window cutter (tpusim/eager/windows.py, also driven by
the PJRT fused target), lint and the validation cases (tpusim/validate) all ask "what kind of op is this, and
how much work is it?". They read the answer here; the recorder stores the family in each
``OpRecord.family``, so the simulator never works it out again from a name. The rules read recorded tensor
metadata (shapes, dtype names, bytes: ``TensorMeta``, ``cost_rules.Meta``) and plain argument values, so
pricing code outside the backend calls the same rules as the backend (tpusim/backend/program_trace/costs.py, which only
turns torch tensors into metadata). The shape formulas themselves are in tpusim/trace/cost_rules.py.

Families (``Family``), with the TensorCore unit that runs them and their fusion role:

=====================  ===========  ===========  =============================================
family                 unit         role         what
=====================  ===========  ===========  =============================================
contraction            mxu          contraction  matmuls and convolutions (implicit GEMM)
quantized_contraction  mxu          contraction  int8 / fp8 / weight-only int8/int4 matmuls
attention              mxu          contraction  fused scaled-dot-product attention
elementwise            vpu          elementwise  everything not listed below (the default)
reduction              vpu          reduction    sums, norms, softmax, losses: read more than
                                                 they write; one per fused kernel (an anchor)
gather_scatter         sparsecore   opaque       embeddings, gathers, scatters, index_put
data_movement          dma          opaque       copies, fills, concatenation: no arithmetic
collective             ici          opaque       functional collectives inside graphs
opaque                 vpu          opaque       sorts, data-dependent shapes: never fused
=====================  ===========  ===========  =============================================

Adding an op = one row in ``OPS`` (keyed by base name: no ``aten::``, overload or trailing ``_``): its
family and either its shape formula (contractions, attention, gathers/scatters) or its FLOPs and
transcendentals per element; an op without a row is elementwise at 1 FLOP per element. Adding a family = one
``Family`` member and one row in ``FAMILIES``. Bytes are logical (numel x itemsize) of the tensors an op reads
and writes, unless its rule says otherwise (gathers read only the rows they fetch).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass
from enum import StrEnum
from typing import Any

from tpusim.trace import cost_rules as rules


class Family(StrEnum):
    CONTRACTION = "contraction"
    QUANTIZED_CONTRACTION = "quantized_contraction"
    ATTENTION = "attention"
    ELEMENTWISE = "elementwise"
    REDUCTION = "reduction"
    GATHER_SCATTER = "gather_scatter"
    DATA_MOVEMENT = "data_movement"
    COLLECTIVE = "collective"
    OPAQUE = "opaque"


@dataclass(frozen=True)
class FamilyInfo:
    """Where a family runs and how fusion treats it (a key of ``tpusim.eager.fusion.RULES``)."""

    unit: str
    role: str


# Adding a family = one row here.
FAMILIES: dict[Family, FamilyInfo] = {
    Family.CONTRACTION: FamilyInfo("mxu", "contraction"),
    Family.QUANTIZED_CONTRACTION: FamilyInfo("mxu", "contraction"),
    Family.ATTENTION: FamilyInfo("mxu", "contraction"),
    Family.ELEMENTWISE: FamilyInfo("vpu", "elementwise"),
    Family.REDUCTION: FamilyInfo("vpu", "reduction"),
    Family.GATHER_SCATTER: FamilyInfo("sparsecore", "opaque"),
    Family.DATA_MOVEMENT: FamilyInfo("dma", "opaque"),
    Family.COLLECTIVE: FamilyInfo("ici", "opaque"),
    Family.OPAQUE: FamilyInfo("vpu", "opaque"),
}


@dataclass(frozen=True)
class Op:
    """One row of ``OPS``: what an op is and how its work is counted.

    ``rule``: the op's shape formula (tpusim/trace/cost_rules.py), read for contractions, attention and
    gathers/scatters; without one the work is counted per element on the VPU: ``flops`` and
    ``transcendentals`` per element (of the output; of the largest input for a reduction), or, for dense
    n x n eigensolvers, ``per_cube`` x b n^3 FLOPs. Data movement and gathers without a rule count no
    arithmetic."""

    family: Family = Family.ELEMENTWISE
    rule: rules.Rule | None = None
    _: KW_ONLY
    flops: float = 1.0
    transcendentals: float = 0.0
    per_cube: float = 0.0


_UNLISTED = Op()        # an op without a row: elementwise, 1 FLOP per element


def _rows(op: Op, names: str) -> dict[str, Op]:
    return dict.fromkeys(names.split(), op)


def _table(*groups: dict[str, Op]) -> dict[str, Op]:
    table: dict[str, Op] = {}
    for group in groups:
        twice = set(group) & set(table)
        if twice:
            raise ValueError(f"tpusim.trace.ops.OPS: {sorted(twice)} listed twice")
        table.update(group)
    return table


C, Q, A, R = Family.CONTRACTION, Family.QUANTIZED_CONTRACTION, Family.ATTENTION, Family.REDUCTION
G, D, E = Family.GATHER_SCATTER, Family.DATA_MOVEMENT, Family.ELEMENTWISE

# Adding an op = one row here (base name -> family, cost rule). Ops not listed are elementwise, 1 FLOP per element.
OPS: dict[str, Op] = _table(
    # ---- contractions (MXU): one formula each from their shapes
    {"mm": Op(C, rules.mm), "addmm": Op(C, rules.addmm), "_addmm_activation": Op(C, rules.addmm),
     "bmm": Op(C, rules.bmm), "baddbmm": Op(C, rules.baddbmm), "mv": Op(C, rules.mv), "addmv": Op(C, rules.addmv),
     "dot": Op(C, rules.dot), "vdot": Op(C, rules.dot)},
    _rows(Op(C, rules.conv), "convolution convolution_overrideable _convolution"),
    _rows(Op(C, rules.conv_backward), "convolution_backward convolution_backward_overrideable"),
    # ---- quantized contractions: int8 / fp8 / weight-only int8/int4, at their inputs' MXU rate
    {"_int_mm": Op(Q, rules.int_mm), "_scaled_mm": Op(Q, rules.scaled_mm),
     "_weight_int8pack_mm": Op(Q, rules.weight_only_mm), "_weight_int4pack_mm": Op(Q, rules.weight_only_mm)},
    # ---- attention: fused flash kernels (the argument: is_causal's position in each schema); the overrideable
    # op is TorchTPU's StableHLO path, taken where its flash kernel's conditions fail (backend/csrc/attention.cpp)
    {"_scaled_dot_product_flash_attention_for_cpu": Op(A, rules.torchtpu_flash(4, False)),
     "_scaled_dot_product_fused_attention_overrideable": Op(A, rules.sdpa_unfused(False)),
     "_scaled_dot_product_flash_attention_for_cpu_backward": Op(A, rules.torchtpu_flash(7, True)),
     "_scaled_dot_product_fused_attention_overrideable_backward": Op(A, rules.sdpa_unfused(True)),
     # tpusim's own fused attention (tpusim/backend/aten/flash_attention.py): (q, k, v, mask, dropout, causal, scale)
     # and (grad, q, k, v, mask, out, lse, causal, scale)
     "tpusim::attention": Op(A, rules.sdpa(5)), "tpusim::attention_backward": Op(A, rules.sdpa_backward(7))},
    # ---- reductions (VPU): read more than they write; one per fused kernel
    _rows(Op(R), """
        sum mean amax amin max min aminmax var std var_mean std_mean norm linalg_vector_norm prod
        argmax argmin all any count_nonzero cumsum cumprod nll_loss_forward nll_loss2d_forward
    """),
    {"logsumexp": Op(R, transcendentals=1), "_softmax": Op(R, flops=5, transcendentals=1),
     "_log_softmax": Op(R, flops=5, transcendentals=1), "_softmax_backward_data": Op(R, flops=4),
     "_log_softmax_backward_data": Op(R, flops=4, transcendentals=1), "_fused_rms_norm": Op(R, flops=6),
     "mse_loss": Op(R, flops=3), "binary_cross_entropy_with_logits": Op(R, transcendentals=2)},
    _rows(Op(R, flops=8), "native_layer_norm native_batch_norm _native_batch_norm_legit native_group_norm"),
    _rows(Op(R, flops=12), "native_layer_norm_backward native_batch_norm_backward native_group_norm_backward"),
    # ---- gathers and scatters (SparseCore): the rows fetched or written, not the whole table
    _rows(Op(G, rules.gather), "embedding index_select gather index _unsafe_index take masked_select"),
    _rows(Op(G, rules.embedding_bag), "_embedding_bag _embedding_bag_forward_only embedding_bag"),
    _rows(Op(G, rules.scatter), """
        embedding_dense_backward _embedding_bag_backward _embedding_bag_dense_backward
        _embedding_bag_per_sample_weights_backward
        scatter scatter_add scatter_reduce index_add index_put _index_put_impl index_copy index_fill
        masked_scatter _unsafe_index_put embedding_renorm
    """),
    # ---- data movement (DMA): copies, fills, concatenation: no arithmetic
    _rows(Op(D), """
        copy _copy_from _copy_from_and_resize clone _to_copy cat stack fill zero zeros_like constant_pad_nd
        repeat flip roll narrow_copy split_with_sizes_copy unbind_copy as_strided_copy expand_copy
        permute_copy tril triu lift_fresh_copy alias_copy view_copy _reshape_copy
    """),
    # ---- torch.tpu.ops kernels keep their namespace (tpusim/backend/torchtpu/ops.py)
    {"tpu::ragged_dot": Op(C, rules.ragged_dot), "tpu::ragged_dot_rhs_grad": Op(C, rules.ragged_dot_rhs_grad),
     "tpu::splash_attention": Op(A, rules.splash(backward=False)),
     "tpu::splash_attention_backward": Op(A, rules.splash(backward=True)),
     "tpu::sparse_dense_matmul": Op(G, rules.sparse_dense_matmul(0, 3)),
     "tpu::sparse_dense_matmul_csr": Op(G, rules.sparse_dense_matmul(1, 3)),
     "tpu::sparse_dense_matmul_grad": Op(G, rules.sparse_dense_matmul_grad(1)),
     "tpu::sparse_dense_matmul_grad_csr": Op(G, rules.sparse_dense_matmul_grad(2))},
    # ---- opaque: sorts, data-dependent shapes: never fused
    _rows(Op(Family.OPAQUE), """
        sort argsort topk kthvalue median nanmedian mode nonzero unique _unique2 unique_consecutive
        multinomial randperm _local_scalar_dense
    """),
    # ---- elementwise (VPU) with more than 1 FLOP or with transcendentals (exp, log, tanh, ...) per element
    _rows(Op(E, transcendentals=1), """
        exp exp2 expm1 log log2 log10 log1p sin cos tan asin acos atan atan2 sinh cosh asinh acosh atanh
        erf erfc erfinv rsqrt sqrt softplus_backward elu elu_backward selu celu log_sigmoid_backward reciprocal
        binary_cross_entropy logit xlogy special_xlog1py lgamma digamma polygamma sinc bernoulli exponential
    """),
    _rows(Op(E, transcendentals=2), "pow softplus log_sigmoid_forward normal"),
    _rows(Op(E, transcendentals=3), "mish mish_backward"),
    {"gelu": Op(E, flops=8, transcendentals=1), "gelu_backward": Op(E, flops=12, transcendentals=2),
     "silu": Op(E, flops=4, transcendentals=1), "silu_backward": Op(E, flops=6, transcendentals=1),
     "sigmoid": Op(E, flops=4, transcendentals=1), "tanh": Op(E, flops=4, transcendentals=1), "addcmul": Op(E, flops=2),
     "addcdiv": Op(E, flops=2), "lerp": Op(E, flops=3), "_fused_adam": Op(E, flops=16), "_fused_adamw": Op(E, flops=17),
     "_native_batch_norm_legit_no_training": Op(E, flops=4)},
    # fused RNN cells, per element of their largest output (the gate workspace): 3 sigmoids + 2 tanh over 4H
    # (LSTM), 2 sigmoids + 1 tanh over 5H (GRU), sigmoid/tanh = 4 FLOPs each; backward needs one tanh per hidden
    # unit (LSTM) and its FLOPs include the bias-gradient sums
    {"_thnn_fused_lstm_cell": Op(E, flops=9, transcendentals=1.25),
     "_thnn_fused_lstm_cell_backward_impl": Op(E, flops=7.5, transcendentals=0.25),
     "_thnn_fused_gru_cell": Op(E, flops=5, transcendentals=0.6), "_thnn_fused_gru_cell_backward": Op(E, flops=7.33)},
    # dense eigensolvers of an n x n matrix (batch b): the Francis QR algorithm for the real Schur form costs
    # about 25 n^3 with the Schur vectors (eigenvectors follow from them by a triangular solve) and 10 n^3 for
    # the eigenvalues alone: Golub & Van Loan, Matrix Computations (4th ed.), section 7.5.6
    {"linalg_eig": Op(per_cube=25.0), "_linalg_eigvals": Op(per_cube=10.0)},
)
del C, Q, A, R, G, D, E

FOREACH_PREFIX = "_foreach_"


def add_kernel(name: str, op: Op = Op(Family.OPAQUE)) -> None:
    """Give a kernel a program defines while it runs its row (torch_tpu's ``jax_op``: a user's JAX function as
    one torch op, "ns::name"); by default one opaque kernel: never fused, 1 FLOP per output element, its
    tensors' bytes. Its records carry the family, so a saved trace prices the same without the row."""
    OPS[base_name(name)] = op


def base_name(op: str) -> str:
    """"aten::add_.Tensor" -> "add": in-place, out and overload variants share a family and a rule."""
    short = op.removeprefix("aten::").split(".")[0]
    if short.endswith("_") and not short.endswith("__"):
        short = short[:-1]
    return short


def family_of(op: str) -> Family:
    """The family of an op by name (``aten::x``, ``aten::x.overload`` or a base name).

    ``_foreach_*`` ops are the per-tensor op applied to a list: ``_foreach_copy`` moves data,
    the others are elementwise."""
    short = base_name(op)
    if short.startswith(FOREACH_PREFIX):
        return Family.DATA_MOVEMENT if short == FOREACH_PREFIX + "copy" else Family.ELEMENTWISE
    return OPS.get(short, _UNLISTED).family


def unit_of(family: Family | str) -> str:
    return FAMILIES[Family(family)].unit


def fusion_role(family: Family | str, unit: str, flops: float, transcendentals: float) -> str:
    """The fusion role of one recorded op: its family's role, except that work off the TensorCore
    (SparseCore, DMA) and ops without any counted arithmetic (no cost rule applied: we do not know
    what they do) never fuse."""
    if unit not in ("vpu", "mxu") or (flops == 0 and transcendentals == 0):
        return "opaque"
    return FAMILIES[Family(family)].role


# ---------------------------------------------------------------- what an op costs

@dataclass(frozen=True)
class OpCost:
    """An op's work: its family (and so its unit), FLOPs, transcendentals, MXU matmul shape and bytes."""

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


def reads_arguments(name: str) -> bool:
    """Whether the op's cost rule reads its tensors' shapes and its arguments (a shape formula), not only
    its tensors' element counts."""
    row = OPS.get(base_name(name))
    return row is not None and row.rule is not None


def op_cost(name: str, ins: Sequence[Any], outs: Sequence[Any], args: tuple) -> OpCost:
    """The cost of one op from its (device) input and output tensors' metadata (``shape``, ``dtype`` name,
    ``nbytes``; outputs may hold None) and its positional arguments (tensors as metadata, the rest plain)."""
    row = OPS.get(base_name(name))
    if row is not None and row.rule is not None:
        try:
            work = row.rule(ins, outs, args)
        except (AttributeError, IndexError, TypeError, ValueError):
            return OpCost(row.family)        # no counted work: fusion runs it alone
        return OpCost(row.family, **vars(work))     # a rule's Work is the cost but for the row's family
    return counted_cost(name, tuple(rules.numel(t) for t in ins),
                        tuple(rules.numel(t) for t in outs if t is not None))


_COUNTED: dict[tuple, OpCost] = {}       # (name, input sizes, output sizes) -> OpCost: the recorder asks per op


def counted_cost(name: str, in_numels: tuple[int, ...], out_numels: tuple[int, ...]) -> OpCost:
    """The cost of an op without a shape formula, from the element counts of its (device) inputs and outputs."""
    key = (name, in_numels, out_numels)
    found = _COUNTED.get(key)
    if found is None:
        if len(_COUNTED) > 100_000:     # a program of ever-new shapes: keep the memory bounded
            _COUNTED.clear()
        found = _COUNTED[key] = counted(name, in_numels, out_numels)
    return found


def counted(name: str, in_numels: tuple[int, ...], out_numels: tuple[int, ...]) -> OpCost:
    """``counted_cost`` without the cache: per element of the output (of the largest input for a reduction;
    of all the lists' tensors for ``_foreach_*``), at its row's FLOPs and transcendentals per element."""
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
    row = OPS.get(short, _UNLISTED)
    flops = elements * row.flops
    if row.per_cube:
        flops = rules.per_cube(row.per_cube, in_numels, out_numels) or flops
    return OpCost(family, float(flops), float(elements * row.transcendentals))
