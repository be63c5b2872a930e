"""A GPT-style decoder trained with FSDP2 x tensor parallelism on a 2D DeviceMesh (fsdp, tp).

Plain torch.distributed, written for torchrun; on the simulated slice:

    python -m tpusim run examples/fsdp_tp_gpt.py --topology 2d:2x2                 # 4 processes, exact
    python -m tpusim run examples/fsdp_tp_gpt.py --topology 3d:8x8x8 --mode all --numerics off \\
        --tokens-per-step 524288 -- --layers 4 --d-model 4096 --heads 32 --seq 2048 --batch 4 --steps 4 \\
        --vocab 32000 --dtype bfloat16                                              # rank 0 of 512, priced

(524288 tokens per step = 4 sequences per fsdp rank x 64 fsdp ranks x 2048 tokens.)

Tensor parallelism (Megatron style): q, k, v and the first MLP layer are column-parallel, the
attention output and the second MLP layer row-parallel, over mesh dim "tp"; every block and the
whole model are then sharded with ``fully_shard`` over mesh dim "fsdp".
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.nn import functional as F


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.head_dim = d_model // heads
        self.norm1 = nn.LayerNorm(d_model)
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, 4 * d_model)
        self.fc2 = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        h = self.norm1(x)
        q, k, v = (lin(h).view(batch, seq, -1, self.head_dim).transpose(1, 2) for lin in (self.q, self.k, self.v))
        attention = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attention.transpose(1, 2).reshape(batch, seq, -1))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int, d_model: int, heads: int, layers: int, seq: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.position = nn.Parameter(torch.randn(seq, d_model) * 0.02)
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


TP_PLAN = {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(), "proj": RowwiseParallel(),
           "fc1": ColwiseParallel(), "fc2": RowwiseParallel()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--batch", type=int, default=2, help="sequences per fsdp rank")
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                        help="parameter and activation dtype (bfloat16: what TPU training runs at its MXU peak)")
    parser.add_argument("--tp", type=int, default=0,
                        help="tensor-parallel degree, the innermost mesh dim (default: 8, one torus axis of a "
                             "big slice, or 2 on small worlds)")
    args = parser.parse_args()

    dist.init_process_group("tpusim")
    world, rank = dist.get_world_size(), dist.get_rank()
    tp = args.tp or (8 if world % 8 == 0 and world > 8 else 2 if world % 2 == 0 else 1)
    tp = min(tp, world)
    mesh = init_device_mesh("tpu", (world // tp, tp), mesh_dim_names=("fsdp", "tp"))

    torch.manual_seed(0)
    with torch.device("tpu"):       # built on the device: with --numerics off nothing is allocated on this machine
        model = GPT(args.vocab, args.d_model, args.heads, args.layers, args.seq).to(getattr(torch, args.dtype))
    for block in model.blocks:
        parallelize_module(block, mesh["tp"], TP_PLAN)
        fully_shard(block, mesh=mesh["fsdp"])
    fully_shard(model, mesh=mesh["fsdp"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)

    # every tp rank of one fsdp row sees the same batch; fsdp rows see different batches
    generator = torch.Generator().manual_seed(1000 + mesh["fsdp"].get_local_rank())
    readable = os.environ.get("TPUSIM_NUMERICS", "on") != "off"
    for step in range(args.steps):
        tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=generator).to("tpu")
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, args.vocab).float(), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if rank == 0 and readable:
            print(f"step {step}: loss {loss.item():.4f} (mesh fsdp={world // tp} x tp={tp})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
