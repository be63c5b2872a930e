"""A dropping top-2 mixture-of-experts layer written the usual PyTorch way, under torch.compile(backend="tpu"):
router, softmax, topk, F.one_hot (which traces to ``aten._assert_async.msg``), positions by cumsum, index_put
into a capacity buffer, batched expert matmuls, combine. It must compile whole (no graph run op by op) and
train like CPU (validation/moe_decoder.py is the full model)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tpusim.backend as tb

EXPERTS, TOP_K, D, HIDDEN, CAPACITY = 4, 2, 16, 32, 5


class DroppingMoE(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(D, EXPERTS, bias=False)
        self.up = nn.Parameter(torch.randn(EXPERTS, D, HIDDEN) / D**0.5)
        self.down = nn.Parameter(torch.randn(EXPERTS, HIDDEN, D) / HIDDEN**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.shape[0]
        weights, chosen = self.router(x).softmax(-1).topk(TOP_K, dim=-1)
        routed = F.one_hot(chosen, EXPERTS).reshape(tokens * TOP_K, EXPERTS)
        position = ((routed.cumsum(0) - 1) * routed).sum(-1)
        kept = position < CAPACITY
        slot = torch.where(kept, position, CAPACITY)            # the dropped copies go to a spare slot
        expert = chosen.reshape(-1)
        buffer = x.new_zeros(EXPERTS, CAPACITY + 1, D).index_put((expert, slot), x.repeat_interleave(TOP_K, 0))
        out = torch.bmm(F.gelu(torch.bmm(buffer, self.up)), self.down)
        combined = out[expert, slot] * (weights.reshape(-1, 1) * kept.unsqueeze(-1))
        return combined.view(tokens, TOP_K, D).sum(1)


def test_a_dropping_top2_moe_compiles_whole_and_trains_like_cpu() -> None:
    from tpusim.backend.torch_compile.jax_backend import reset_stats

    reset_stats()
    torch.manual_seed(0)
    cpu = DroppingMoE()
    x = torch.randn(12, D)                                       # 24 routed copies, 20 slots: some are dropped
    tpu = DroppingMoE().to("tpu")
    tpu.load_state_dict(cpu.state_dict())
    want = cpu(x)
    want.square().sum().backward()
    got = torch.compile(tpu, backend="tpu")(x.to("tpu"))
    got.square().sum().backward()
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    for (name, p), q in zip(tpu.named_parameters(), cpu.parameters(), strict=True):
        torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-5, atol=1e-5, msg=name)
    stats = tb.compile_stats()
    assert {g.kind for g in stats.graphs} == {"forward", "backward"} and not stats.graph_breaks, stats.summary()
    assert all(g.lowered for g in stats.graphs), stats.summary()          # none ran op by op


def test_assert_async_is_a_no_op_in_a_compiled_graph() -> None:
    from tpusim.backend.torch_compile.jax_backend import reset_stats

    reset_stats()

    def checked(x: torch.Tensor) -> torch.Tensor:
        torch._assert_async((x > -100).all())
        torch._assert_async((x < 100).all(), "x out of range")
        return x * 2

    x = torch.randn(8)
    torch.testing.assert_close(torch.compile(checked, backend="tpu")(x.to("tpu")).cpu(), x * 2)
    assert all(g.lowered for g in tb.compile_stats().graphs), tb.compile_stats().summary()


FSDP_INSIDE_COMPILE = """
import os, sys
os.environ.update(TPUSIM_RANKS="one", RANK="0", WORLD_SIZE="1")
import torch, torch.distributed as dist
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
import tpusim.backend as tb

dist.init_process_group("tpusim", store=dist.HashStore(), rank=0, world_size=1)
mesh = init_device_mesh("tpu", (1,))

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.router, self.experts = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        return self.experts(self.router(x).relu())     # the experts' line

block = Block()
fully_shard(block.experts, mesh=mesh)                  # sharded apart (expert parallel does this), then compiled
if sys.argv[1] == "checkpointed":
    block = checkpoint_wrapper(block)
block.compile(backend="tpu")
fully_shard(block, mesh=mesh)
block(torch.randn(4, 8, device="tpu")).sum().backward()
for b in tb.compile_stats().graph_breaks:
    print("BREAK", b.source.rsplit("/", 1)[-1], "|", b.reason)
print("GRAPHS", len(tb.compile_stats().graphs))
dist.destroy_process_group()
"""


@pytest.mark.parametrize("wrapped", ["plain", "checkpointed"])
def test_a_graph_break_at_fsdp_hooks_inside_a_compiled_module_is_named(tmp_path, wrapped: str) -> None:
    """FSDP2 marks its hooks not to be traced, so a fully_shard'ed submodule inside a compiled module splits the
    graph; the break must say that (Dynamo's own reason names only a skipped ``disable``), and, inside activation
    checkpointing, that nothing of the module compiles."""
    import subprocess
    import sys

    script = tmp_path / "fsdp_inside_compile.py"
    script.write_text(FSDP_INSIDE_COMPILE)
    done = subprocess.run([sys.executable, str(script), wrapped], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    breaks = [line.split(" ", 1)[1] for line in done.stdout.splitlines() if line.startswith("BREAK ")]
    graphs = int(done.stdout.split("GRAPHS ", 1)[1].split()[0])
    assert breaks and all(b.startswith(f"{script.name}:") for b in breaks), done.stdout
    assert any("FSDP2's hooks" in b and "fully_shard" in b for b in breaks), breaks
    if wrapped == "checkpointed":       # Dynamo compiled nothing of it, and the reason says so
        assert graphs == 0 and all("runs eagerly, op by op" in b for b in breaks), (graphs, breaks)
    else:                               # the code on each side of the submodule compiled
        assert graphs >= 2 and not any("op by op" in b for b in breaks), (graphs, breaks)
