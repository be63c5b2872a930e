"""The shared cost rules (tpusim/trace/cost_rules.py, one row per op in tpusim/trace/ops.py ``OPS``) over
recorded tensor metadata, against closed forms; torch-free."""

import pytest

from tpusim.trace import cost_rules as rules
from tpusim.trace import ops
from tpusim.trace.cost_rules import Meta
from tpusim.trace.ops import OPS, Family, OpCost, op_cost
from tpusim.trace.records import TensorMeta


def bf16(*shape: int) -> Meta:
    return Meta(shape, "bfloat16", 2)


def i64(*shape: int) -> Meta:
    return Meta(shape, "int64", 8)


def priced(name: str, ins: list, outs: list, args: tuple) -> tuple[OpCost, float, float]:
    """The cost and the bytes read and written, defaulting to all inputs and all outputs as the recorder does."""
    cost = op_cost(name, ins, outs, args)
    read = cost.bytes_read if cost.bytes_read is not None else sum(t.nbytes for t in ins)
    written = cost.bytes_written if cost.bytes_written is not None else sum(t.nbytes for t in outs if t is not None)
    return cost, read, written


@pytest.mark.parametrize(("m", "k", "n"), [(4, 8, 3), (128, 256, 512), (1, 1, 1)])
def test_a_matmul_is_2mnk_flops_and_moves_its_inputs_and_output(m, k, n):
    a, b, c = bf16(m, k), bf16(k, n), bf16(m, n)
    cost, read, written = priced("aten::mm", [a, b], [c], (a, b))
    assert (cost.family, cost.unit) == (Family.CONTRACTION, "mxu")
    assert cost.flops == 2 * m * n * k and cost.matmul == (1, m, k, n)
    assert (read, written) == (2 * (m * k + k * n), 2 * m * n)


def test_addmm_and_baddbmm_add_the_bias_once_per_output_element():
    bias, a, b, c = bf16(4, 3), bf16(4, 8), bf16(8, 3), bf16(4, 3)
    assert op_cost("aten::addmm", [bias, a, b], [c], (bias, a, b)).flops == 2 * 4 * 8 * 3 + 4 * 3
    x, y, out = bf16(5, 4, 8), bf16(5, 8, 3), bf16(5, 4, 3)
    assert op_cost("aten::bmm", [x, y], [out], (x, y)).matmul == (5, 4, 8, 3)
    assert op_cost("aten::baddbmm", [out, x, y], [out], (out, x, y)).flops == 5 * (2 * 4 * 8 * 3 + 4 * 3)


def test_recorded_tensor_metadata_prices_like_the_backend_s():
    a = TensorMeta(id=1, shape=(4, 8), dtype="bfloat16", nbytes=64, storage=1)
    b = TensorMeta(id=2, shape=(8, 3), dtype="bfloat16", nbytes=48, storage=2)
    c = TensorMeta(id=3, shape=(4, 3), dtype="bfloat16", nbytes=24, storage=3)
    assert op_cost("aten::mm.out", [a, b], [c], (a, b)) == op_cost("aten::mm", [bf16(4, 8), bf16(8, 3)], [bf16(4, 3)],
                                                                   (bf16(4, 8), bf16(8, 3)))
    assert rules.itemsize(a) == 2


def test_a_convolution_is_an_implicit_gemm():
    # N=2, C=3 -> O=6 channels, 3x3 kernel, 9x9 -> 7x7: M = N*7*7, K = C*3*3, N = O
    inp, weight, out = bf16(2, 3, 9, 9), bf16(6, 3, 3, 3), bf16(2, 6, 7, 7)
    args = (inp, weight, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    cost = op_cost("aten::convolution", [inp, weight], [out], args)
    assert cost.matmul == (1, 2 * 49, 27, 6) and cost.flops == 2 * 2 * 49 * 27 * 6


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_counts_the_kept_scores(causal):
    """tpusim's compiled flash op (``tpusim::attention``): exactly the kept triangle, never the s x s scores."""
    b, h, s, d = 2, 4, 64, 16
    q, o = bf16(b, h, s, d), bf16(b, h, s, d)
    cost, read, written = priced("tpusim::attention", [q, q, q], [o], (q, q, q, None, 0.0, causal, None))
    kept = (s * (s + 1) / 2) / (s * s) if causal else 1.0
    scores = b * h * s * s * kept
    assert cost.family == Family.ATTENTION and cost.transcendentals == scores
    assert cost.flops == scores * (2 * 2 * d + 5)                    # QK^T and PV, plus 5 VPU FLOPs a score
    assert cost.matmul == (round(2 * scores / (s * s)), s, d, s)
    assert (read, written) == (3 * q.nbytes, o.nbytes)              # never the s x s scores
    back = op_cost("tpusim::attention_backward", [o, q, q, q], [q, q, q],
                   (o, q, q, q, None, o, Meta((b, h, s), "float32", 4), causal, None))
    assert back.flops == scores * (2 * 5 * d + 5)                    # 5 matmuls
    assert rules.flash_attention(b * h, s, s, d, d, backward=False, kept=kept) == rules.Work(
        cost.flops, cost.transcendentals, cost.matmul)


# TorchTPU's eager flash kernel (torch_tpu flash_attention_config.h and its tiling): 512 x 512 tiles, a shorter
# sequence one tile of its length rounded up to 128; padded tiles computed, causal skipping whole tiles only.
@pytest.mark.parametrize(("s", "causal", "tiles"), [
    (8192, True, 16 * 17 // 2),       # 16 x 16 tiles of 512, the diagonal's in full: 136 of 256
    (2048, True, 4 * 5 // 2),         # 10 of 16 tiles: 0.625 of the scores where the triangle is 0.5002
    (2048, False, 16),
    (300, True, 1),                   # one 384 x 384 tile (300 rounded up to 128s)
])
def test_torchtpu_eager_flash_computes_whole_tiles(s, causal, tiles):
    b, h, d = 1, 2, 128
    q = bf16(b, h, s, d)
    tile = 512 if s >= 512 else -(-s // 128) * 128
    cost = op_cost("aten::_scaled_dot_product_flash_attention_for_cpu", [q, q, q], [q], (q, q, q, 0.0, causal))
    assert cost.transcendentals == b * h * tiles * tile * tile
    assert cost.flops == b * h * tiles * tile * tile * (2 * 2 * d + 5)


def test_torchtpu_eager_flash_repeats_grouped_kv_through_hbm():
    """Grouped-query K/V are repeated to every query head before TorchTPU's eager kernel (its ReplicateKV): the
    copies are written and read, and no query head shares another's K/V tile."""
    b, hq, hkv, s, d = 1, 16, 2, 1024, 128
    q, kv, o, lse = bf16(b, hq, s, d), bf16(b, hkv, s, d), bf16(b, hq, s, d), Meta((b, hq, s), "float32", 4)
    name = "aten::_scaled_dot_product_flash_attention_for_cpu"
    cost, read, written = priced(name, [q, kv, kv], [o, lse], (q, kv, kv, 0.0, True))
    repeated = 2 * kv.nbytes * (hq // hkv)
    assert read == q.nbytes + 2 * kv.nbytes + repeated
    assert written == o.nbytes + lse.nbytes + repeated
    full = op_cost(name, [q, q, q], [o, lse], (q, q, q, 0.0, True))
    assert cost.matmul == full.matmul and cost.flops == full.flops     # each query head against its own copy


def test_torchtpu_shlo_attention_sends_the_scores_through_hbm_in_f32():
    """Off the flash kernel (head dim 192), TorchTPU's StableHLO path: every score computed, the s x t scores
    through HBM as f32 (4 passes forward, 6 backward), the matmuls at the f32 rate."""
    b, h, s, d = 1, 4, 1024, 192
    q, lse = bf16(b, h, s, d), Meta((b, h, s), "float32", 4)
    cost, read, written = priced("aten::_scaled_dot_product_fused_attention_overrideable", [q, q, q], [q, lse],
                                 (q, q, q, None, 0.0, True))
    scores = b * h * s * s
    assert cost.transcendentals == scores and cost.dtype == "float32"
    assert read + written == 4 * q.nbytes + lse.nbytes + 4 * 4 * scores
    back, read, written = priced("aten::_scaled_dot_product_fused_attention_overrideable_backward",
                                 [q, q, q, q, q, lse], [q, q, q], (q, q, q, q, None))
    assert read + written == 5 * q.nbytes + lse.nbytes + 3 * q.nbytes + 6 * 4 * scores


def test_a_grouped_query_decode_step_shares_each_kv_tile_among_its_query_heads():
    """One decode token (s = 1) of 8 query heads over 1 K/V head: the same FLOPs as 8 heads over their own K/V,
    as one matmul of 8 query rows a K/V head, so the MXU loads each K/V tile once, not once a query head."""
    from tpusim.hardware.calibration import calibrated, load_calibration
    from tpusim.hardware.compute import mxu_stream_seconds
    from tpusim.hardware.spec import load_chip

    b, hq, hkv, t, d = 32, 8, 1, 8192, 128
    q, kv, kv_expanded, o = bf16(b, hq, 1, d), bf16(b, hkv, t, d), bf16(b, hq, t, d), bf16(b, hq, 1, d)
    name = "tpusim::attention"                   # the compiled decode step's attention
    grouped = op_cost(name, [q, kv, kv], [o], (q, kv, kv, None, 0.0, False, None))
    expanded = op_cost(name, [q, kv_expanded, kv_expanded], [o],
                       (q, kv_expanded, kv_expanded, None, 0.0, False, None))
    assert grouped.flops == expanded.flops == b * hq * t * (2 * 2 * d + 5)
    assert grouped.matmul == (2 * b * hkv, hq, d, t) and expanded.matmul == (2 * b * hq, 1, d, t)
    chip = calibrated(load_chip("v5e"), load_calibration("v5e"))
    # both wait for each tile's weights (8 rows, padded or grouped, < 128 load cycles): 8x fewer tiles grouped
    ratio = mxu_stream_seconds(expanded.matmul, "bfloat16", chip) / mxu_stream_seconds(grouped.matmul, "bfloat16", chip)
    assert ratio == pytest.approx(hq, rel=0.01)


def test_a_sliding_window_keeps_at_most_window_plus_one_keys_per_query():
    assert rules.window_fraction(8, 8, 0) == 8 / 64
    assert rules.window_fraction(8, 8, 100) == rules.causal_fraction(8, 8) == 36 / 64
    assert rules.window_fraction(8, 8, 2) == (1 + 2 + 3 * 6) / 64


def test_a_gather_reads_the_rows_it_fetches_and_its_indices():
    table, ids, out = bf16(1000, 64), i64(7), bf16(7, 64)
    cost, read, written = priced("aten::embedding", [table, ids], [out], (table, ids))
    assert (cost.family, cost.unit, cost.flops) == (Family.GATHER_SCATTER, "sparsecore", 0.0)
    assert (read, written) == (7 * 64 * 2 + 7 * 8, 7 * 64 * 2)


def test_a_scatter_writes_as_many_elements_as_it_reads():
    dest, ids, src = bf16(100, 16), i64(9), bf16(9, 16)
    cost, read, written = priced("aten::index_put_", [dest, ids, src], [dest], (dest, [ids], src))
    assert cost.flops == 9 * 16 and (read, written) == (9 * 16 * 2 + 9 * 8, 9 * 16 * 2)


def test_elementwise_and_reductions_are_counted_per_element():
    x, y = bf16(32, 128), bf16(32)
    assert op_cost("aten::add.Tensor", [x, x], [x], (x, x)) == OpCost(Family.ELEMENTWISE, 32 * 128)
    assert op_cost("aten::exp", [x], [x], (x,)) == OpCost(Family.ELEMENTWISE, 32 * 128, 32 * 128)
    assert op_cost("aten::gelu", [x], [x], (x,)) == OpCost(Family.ELEMENTWISE, 8 * 32 * 128, 32 * 128)
    assert op_cost("aten::sum.dim_IntList", [x], [y], (x, [1])) == OpCost(Family.REDUCTION, 32 * 128)  # per input
    assert op_cost("aten::_foreach_exp", [x, y], [x, y], ()).transcendentals == 32 * 128 + 32
    assert op_cost("aten::copy_", [x, x], [x], (x, x)) == OpCost(Family.DATA_MOVEMENT)
    assert OpCost(Family.DATA_MOVEMENT).unit == "dma"


def test_an_eigensolver_is_cubic():
    # 3 matrices of 10 x 10: eigenvalues 3 x 10
    assert op_cost("aten::linalg_eig", [bf16(3, 10, 10)], [bf16(3, 10)], ()).flops == 25.0 * 3 * 10 ** 3


def test_a_rule_that_cannot_read_its_arguments_counts_nothing():
    assert op_cost("aten::mm", [bf16(4)], [bf16(4)], (bf16(4),)) == OpCost(Family.CONTRACTION)


def test_every_op_of_a_shaped_family_has_a_formula_and_only_they_do():
    shaped = {Family.CONTRACTION, Family.ATTENTION, Family.QUANTIZED_CONTRACTION, Family.GATHER_SCATTER}
    assert {name for name, op in OPS.items() if op.family in shaped and op.rule is None} == set()
    assert {name for name, op in OPS.items() if op.rule is not None and op.family not in shaped} == set()
    assert all(ops.reads_arguments(name) == (op.rule is not None) for name, op in OPS.items())


def test_an_op_is_listed_once():
    with pytest.raises(ValueError, match="listed twice"):
        ops._table({"mm": ops.Op()}, {"mm": ops.Op()})
