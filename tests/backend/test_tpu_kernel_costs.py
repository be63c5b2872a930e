"""torch.tpu.ops kernels are priced by their own rules (rows in tpusim/trace/ops.py ``OPS``), against closed forms:
splash attention as flash attention with its masked blocks skipped, ragged_dot as 2 M K N, the SparseCore
lookups as nnz rows moved."""

from __future__ import annotations

import pytest
import torch

from tpusim.backend.program_trace.costs import op_cost
from tpusim.trace.ops import Family


def test_splash_attention_full_and_causal_scores():
    b, h, s, d = 2, 4, 256, 64
    q = k = v = torch.empty(b, h, s, d, dtype=torch.bfloat16)
    out, lse = torch.empty(b, h, s, d), torch.empty(b, h, s)
    full = op_cost("tpu::splash_attention", [q, k, v], [out, lse], (q, k, v, 0.125, False, -1))
    assert full.family == Family.ATTENTION
    assert full.flops == b * h * s * s * (4 * d + 5)            # QK^T and PV (2 x 2d per score) + 5 VPU ops
    causal = op_cost("tpu::splash_attention", [q, k, v], [out, lse], (q, k, v, 0.125, True, -1))
    assert causal.flops == pytest.approx(full.flops * (s + 1) / (2 * s))   # the kept lower triangle


def test_splash_attention_sliding_window_keeps_w_plus_one_keys_per_query():
    b, h, s, d, w = 1, 2, 1024, 128, 127
    q = k = v = torch.empty(b, h, s, d)
    cost = op_cost("tpu::splash_attention", [q, k, v], [q, torch.empty(b, h, s)], (q, k, v, 1.0, True, w))
    kept = sum(min(i, w) + 1 for i in range(s))                  # query i sees keys i-w..i
    assert cost.flops == pytest.approx(b * h * kept * (4 * d + 5))
    assert cost.transcendentals == pytest.approx(b * h * kept)


def test_splash_attention_backward_recomputes_the_scores_in_five_matmuls():
    b, h, s, d = 1, 2, 128, 64
    t = torch.empty(b, h, s, d)
    lse = torch.empty(b, h, s)
    cost = op_cost("tpu::splash_attention_backward", [t] * 6, [t, t, t], (t, t, t, t, lse, t, 1.0, False, -1))
    assert cost.flops == b * h * s * s * (2 * 5 * d + 5)


def test_ragged_dot_is_one_grouped_matmul_over_all_rows():
    m, k, n, groups = 96, 32, 16, 4
    lhs, rhs, sizes = torch.empty(m, k), torch.empty(groups, k, n), torch.tensor([24] * groups)
    cost = op_cost("tpu::ragged_dot", [lhs, rhs, sizes], [torch.empty(m, n)], (lhs, rhs, sizes))
    assert (cost.family, cost.flops, cost.matmul) == (Family.CONTRACTION, 2.0 * m * k * n, (1, m, k, n))
    grad = op_cost("tpu::ragged_dot_rhs_grad", [lhs, torch.empty(m, n), sizes], [rhs],
                   (lhs, torch.empty(m, n), sizes, groups))
    assert grad.flops == 2.0 * m * k * n


@pytest.mark.parametrize("name, args_of", [
    ("tpu::sparse_dense_matmul", lambda ids, table: (ids, torch.zeros_like(ids), torch.ones(ids.numel()), table, 3)),
    ("tpu::sparse_dense_matmul_csr", lambda ids, table: (torch.tensor([0, 2, 3, 5]), ids, torch.ones(ids.numel()),
                                                          table)),
])
def test_sparse_dense_matmul_moves_only_the_looked_up_rows(name, args_of):
    ids, table = torch.tensor([1, 4, 4, 9, 2]), torch.empty(1000, 64)
    args = args_of(ids, table)
    out = torch.empty(3, 64)
    cost = op_cost(name, [a for a in args if isinstance(a, torch.Tensor)], [out], args)
    index = sum(a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor) and not a.is_floating_point())
    assert cost.family == Family.GATHER_SCATTER
    assert cost.flops == 2.0 * 5 * 64
    assert cost.bytes_read == 5 * 64 * 4 + index                   # 5 rows of the 1000-row table, not the table
    assert cost.bytes_written == 3 * 64 * 4
