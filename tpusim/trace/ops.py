"""What an op is: its base name and its family, in one table (torch-free).

Why one table: the cost rules (tpusim/backend/costs.py: which unit, how FLOPs and bytes are counted),
fusion (tpusim/eager/fusion.py: what may fuse with what), the window cutter (tpusim/eager/windows.py, also
driven by the PJRT fused target) and lint all ask "what kind of op is this?". They read the
answer here; the recorder stores it in each ``OpRecord.family``, so the simulator never works
it out again from a name.

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

Adding an op = one row in ``FAMILY_BY_OP`` (keyed by base name: no ``aten::``, overload or
trailing ``_``); an op without a row is elementwise. Adding a family = one ``Family`` member and
one row in ``FAMILIES``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


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


def _rows(family: Family, names: str) -> dict[str, Family]:
    return dict.fromkeys(names.split(), family)


# Adding an op = one row here (base name -> family). Ops not listed are elementwise.
FAMILY_BY_OP: dict[str, Family] = {
    **_rows(Family.CONTRACTION, """
        mm addmm _addmm_activation bmm baddbmm mv addmv dot vdot
        convolution convolution_overrideable _convolution convolution_backward convolution_backward_overrideable
    """),
    **_rows(Family.QUANTIZED_CONTRACTION, """
        _int_mm _scaled_mm _weight_int8pack_mm _weight_int4pack_mm
    """),
    **_rows(Family.ATTENTION, """
        _scaled_dot_product_flash_attention_for_cpu _scaled_dot_product_fused_attention_overrideable
        _scaled_dot_product_flash_attention_for_cpu_backward _scaled_dot_product_fused_attention_overrideable_backward
    """),
    **_rows(Family.REDUCTION, """
        sum mean amax amin max min aminmax var std var_mean std_mean norm linalg_vector_norm prod
        argmax argmin logsumexp all any count_nonzero cumsum cumprod
        _softmax _log_softmax _softmax_backward_data _log_softmax_backward_data
        native_layer_norm native_layer_norm_backward native_batch_norm native_batch_norm_backward
        _native_batch_norm_legit native_group_norm native_group_norm_backward _fused_rms_norm
        nll_loss_forward nll_loss2d_forward mse_loss binary_cross_entropy_with_logits
    """),
    **_rows(Family.GATHER_SCATTER, """
        embedding index_select gather index _unsafe_index take masked_select
        _embedding_bag _embedding_bag_forward_only embedding_bag
        embedding_dense_backward _embedding_bag_backward _embedding_bag_dense_backward
        _embedding_bag_per_sample_weights_backward
        scatter scatter_add scatter_reduce index_add index_put _index_put_impl index_copy index_fill
        masked_scatter _unsafe_index_put embedding_renorm
    """),
    **_rows(Family.DATA_MOVEMENT, """
        copy _copy_from _copy_from_and_resize clone _to_copy cat stack fill zero zeros_like constant_pad_nd
        repeat flip roll narrow_copy split_with_sizes_copy unbind_copy as_strided_copy expand_copy
        permute_copy tril triu lift_fresh_copy alias_copy view_copy _reshape_copy
    """),
    # torch.tpu.ops kernels keep their namespace (tpusim/backend/torchtpu/ops.py; cost rules in tpusim/backend/costs.py)
    **_rows(Family.CONTRACTION, "tpu::ragged_dot tpu::ragged_dot_rhs_grad"),
    **_rows(Family.ATTENTION, "tpu::splash_attention tpu::splash_attention_backward"),
    **_rows(Family.GATHER_SCATTER, """
        tpu::sparse_dense_matmul tpu::sparse_dense_matmul_csr tpu::sparse_dense_matmul_grad
        tpu::sparse_dense_matmul_grad_csr
    """),
    **_rows(Family.OPAQUE, """
        sort argsort topk kthvalue median nanmedian mode nonzero unique _unique2 unique_consecutive
        multinomial randperm _local_scalar_dense
    """),
}

FOREACH_PREFIX = "_foreach_"


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
    return FAMILY_BY_OP.get(short, Family.ELEMENTWISE)


def unit_of(family: Family | str) -> str:
    return FAMILIES[Family(family)].unit


def fusion_role(family: Family | str, unit: str, flops: float, transcendentals: float) -> str:
    """The fusion role of one recorded op: its family's role, except that work off the TensorCore
    (SparseCore, DMA) and ops without any counted arithmetic (no cost rule applied: we do not know
    what they do) never fuse."""
    if unit not in ("vpu", "mxu") or (flops == 0 and transcendentals == 0):
        return "opaque"
    return FAMILIES[Family(family)].role
