"""Activation checkpointing (torch.utils.checkpoint, non-reentrant) in a torch.compile(backend="tpu") block:
the forward program saves fewer activations and the backward program recomputes them (priced as FLOPs)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    from tpusim.backend.torch_compile.jax_backend import reset_stats

    reset_stats()


def _programs(checkpointed: bool) -> tuple[dict, torch.Tensor]:
    from tpusim.backend.program_trace.compiled_program import program_of
    from tpusim.backend.torch_compile.jax_backend import JaxGraph

    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 64))
    block = block.to("tpu")
    fn = (lambda x: checkpoint(block, x, use_reentrant=False)) if checkpointed else block
    debug = []
    x = torch.randn(32, 64, device="tpu", requires_grad=True)
    torch.compile(fn, backend="tpu", options={"debug_callback": debug.append})(x).sum().backward()
    graphs = [g for g in debug[0].compiled_executables if isinstance(g, JaxGraph)]
    return {g.kind: program_of(g.gm, g.kind) for g in graphs}, x.grad.cpu()


def _mxu_flops(program: object) -> float:
    return sum(op.cost.flops for op in program.ops if op.name in ("aten::mm", "aten::addmm"))


def test_checkpointed_block_saves_less_and_recomputes_its_matmuls_in_the_backward():
    plain, plain_grad = _programs(False)
    ckpt, ckpt_grad = _programs(True)
    torch.testing.assert_close(ckpt_grad, plain_grad)
    # saved for the backward: the forward program's outputs beyond the block's result
    assert len(ckpt["forward"].outputs) < len(plain["forward"].outputs)
    # the backward recomputes the forward's matmuls that feed saved activations (all but the last linear's)
    forward_mm = 2 * 32 * (64 * 256 + 256 * 256)
    assert _mxu_flops(ckpt["backward"]) == pytest.approx(_mxu_flops(plain["backward"]) + forward_mm, rel=0.01)
