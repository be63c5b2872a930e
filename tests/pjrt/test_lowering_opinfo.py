"""OpInfo sweep of the ATen -> JAX lowering table against CPU PyTorch (tests/pjrt/sweep.py does the work).

The default run checks a fast subset covering every op family; ``-m slow`` runs every op_db
entry (3 samples each) and requires >= 95% to pass, printing the rate.
"""

from __future__ import annotations

import pytest
import sweep
import torch

FAST = ["add", "sub", "mul", "div", "pow", "exp", "log", "sin", "tanh", "sigmoid", "abs", "neg", "floor",
        "clamp", "where", "eq", "lt", "logical_and", "bitwise_and", "remainder", "atan2", "maximum",
        "sum", "mean", "amax", "argmax", "var", "prod", "cumsum", "sort", "topk", "any",
        "mm", "bmm", "addmm", "matmul", "nn.functional.conv2d", "nn.functional.conv_transpose2d",
        "view", "reshape", "permute", "transpose", "expand", "squeeze", "unsqueeze", "cat", "stack", "split",
        "flip", "roll", "repeat", "tril", "nn.functional.pad", "diagonal", "select_scatter", "slice_scatter",
        "index_select", "gather", "scatter", "scatter_add", "index_put", "index_add", "masked_fill",
        "nn.functional.embedding",
        "softmax", "log_softmax", "nn.functional.layer_norm", "nn.functional.group_norm", "nn.functional.gelu",
        "nn.functional.silu", "nn.functional.max_pool2d", "nn.functional.avg_pool2d",
        "nn.functional.adaptive_avg_pool2d", "nn.functional.cross_entropy", "nn.functional.mse_loss",
        "nn.functional.interpolate.nearest", "full", "arange", "zeros_like", "ones"]


def test_fast_subset_matches_cpu() -> None:
    results = sweep.sweep(FAST, samples=1)
    print("\n" + sweep.summary(results))
    failed = {r.name: r.errors[0] for r in results.values() if not r.ok and r.passed + r.failed}
    assert not failed


def test_every_core_aten_op_has_a_lowering() -> None:
    """Core ATen overloads without a lowering, each with its reason."""
    allowed = {
        "aten._embedding_bag.default": "offsets-based segment sums; embedding bags decompose before Core ATen "
                                       "in torch.compile and run on the host in eager PJRT",
        "aten.col2im.default": "fold's inverse of unfold: rare, runs on the host",
        "aten.grid_sampler_2d.default": "data-dependent bilinear gather: not yet lowered, runs on the host",
        "aten.resize_.default": "changes a tensor's storage size in place: functionalization removes it from "
                                "compiled graphs, and eager PJRT runs it on the host (the window's resize cut)",
    }
    missing = {str(op) for op in sweep._core_ops()} - {str(op) for op in sweep._core_ops()
                                                        if sweep.lowering.covered(op)}
    assert missing <= set(allowed), missing - set(allowed)


def test_dtype_promotion_follows_pytorch() -> None:
    import jax.numpy as jnp

    from tpusim.backend.lowering import lookup

    aten = torch.ops.aten
    i32, f16 = jnp.ones((3,), jnp.int32), jnp.ones((3,), jnp.float16)
    assert lookup(aten.add.Tensor).fn(i32, 2.5).dtype == jnp.float32          # int tensor + float scalar
    assert lookup(aten.add.Tensor).fn(f16, jnp.ones((), jnp.float32)).dtype == jnp.float16   # 0-dim is weaker
    assert lookup(aten.div.Tensor).fn(i32, i32).dtype == jnp.float32          # true division
    assert lookup(aten.sum.dim_IntList).fn(jnp.ones((3,), jnp.bool_), [0]).dtype == jnp.int64
    assert lookup(aten.sin.default).fn(i32).dtype == jnp.float32
    assert lookup(aten.eq.Scalar).fn(f16, 1).dtype == jnp.bool_


@pytest.mark.slow
def test_full_sweep_pass_rate() -> None:
    results = sweep.sweep(samples=3)
    tested = [r for r in results.values() if r.passed + r.failed]
    rate = sum(r.ok for r in tested) / len(tested)
    print("\n" + sweep.summary(results))
    for r in tested:
        if not r.ok:
            print(f"  FAIL {r.name}: {r.errors[0] if r.errors else ''}")
    assert rate >= 0.95
