"""A GPT-3-style decoder (up to 175B) trained with FSDP2 x tensor + sequence parallelism, compiled per block.

Plain torch.distributed, written for torchrun; on the simulated slice:

    python -m tpusim run examples/gpt3.py --topology 2d:2x2 --ranks all -- --check        # exact, vs CPU
    python -m tpusim run examples/gpt3.py --topology 3d:8x8x8 --numerics off -- --preset 175b --int8 --checkpoint

(175B at 2 sequences per fsdp rank needs ``--checkpoint`` to fit a v5p's 95 GiB: without it the run stops
with the simulated chip's out-of-memory error, as a real one would; ``--batch 1`` fits without.)

The parallel plan is torchtitan's: on mesh dim "tp", q/k/v and the first MLP layer are
column-parallel, the attention output and the second MLP layer row-parallel with their outputs
sharded along the sequence (sequence parallelism: the LayerNorms run on sequence shards); the
embeddings are row-parallel with sequence-sharded outputs and the LM head column-parallel with
replicated logits; each block, then the whole model, is sharded with ``fully_shard`` over mesh dim
"fsdp". Each block is ``torch.compile``'d (backend "tpu") before sharding, as torchtitan does, so the
tensor-parallel collectives are functional collectives inside the compiled graphs.

The model is built on the meta device and materialised with ``to_empty`` (a 175B model never exists
whole on one host). ``--int8`` runs every linear layer's matmul in int8 (``torch._int_mm``: inputs
quantised per row, weights per output channel, a straight-through backward in the model's dtype); on
row-parallel layers each rank quantises its own shard of the row, as a tensor-parallel int8 kernel does.
``--check``: every rank also trains the same model on CPU over the whole batch and compares the
parameters after the last step (with ``--int8``, the CPU model quantises its row-parallel layers' rows in
as many slices as there are tensor-parallel shards, so both round the same numbers).
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.nn import functional as F

PRESETS = {   # GPT-3 paper (Brown et al. 2020), table 2.1; vocab padded to a multiple of 128 (GPT-2's 50257)
    "125m": {"layers": 12, "d_model": 768, "heads": 12, "seq": 2048, "vocab": 50304},
    "1.3b": {"layers": 24, "d_model": 2048, "heads": 16, "seq": 2048, "vocab": 50304},
    "13b": {"layers": 40, "d_model": 5120, "heads": 40, "seq": 2048, "vocab": 50304},
    "175b": {"layers": 96, "d_model": 12288, "heads": 96, "seq": 2048, "vocab": 50304},
}


def int8_matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x @ w.T with x's rows and w's output channels quantised to int8 (absmax scales), ``torch._int_mm``."""
    sx = x.abs().amax(1, keepdim=True).clamp(min=1e-8) / 127
    sw = w.abs().amax(1, keepdim=True).clamp(min=1e-8) / 127
    qx = (x / sx).round().clamp(-127, 127).to(torch.int8)
    qw = (w / sw).round().clamp(-127, 127).to(torch.int8)
    return torch._int_mm(qx, qw.t()).to(x.dtype) * sx * sw.t()


class Int8Matmul(torch.autograd.Function):
    """x @ w.T in int8, the contracted dimension quantised in ``groups`` slices with scales of their own (a
    row-parallel layer's shards: each rank quantises its slice of the row; the all-reduce sums the slices);
    the backward is the float matmuls' (straight-through), as int8 training recipes do."""

    @staticmethod
    def forward(ctx: object, x: torch.Tensor, w: torch.Tensor, groups: int = 1) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        rows = x.reshape(-1, x.shape[-1])
        slices = [int8_matmul(xs, ws) for xs, ws in zip(rows.chunk(groups, 1), w.chunk(groups, 1), strict=True)]
        out = slices[0] if groups == 1 else torch.stack(slices).sum(0)
        return out.reshape(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x, w = ctx.saved_tensors
        grad_x = grad @ w
        grad_w = grad.reshape(-1, grad.shape[-1]).t() @ x.reshape(-1, x.shape[-1])
        return grad_x, grad_w, None


class Linear(nn.Linear):
    """nn.Linear without bias whose matmul is int8 when ``int8`` (tensor-parallel styles accept it: a Linear).
    ``k_groups``: on one device, quantise the input dimension in that many slices, as ``k_groups``
    row-parallel shards do (``--check``'s CPU reference of a tensor-parallel int8 model)."""

    def __init__(self, d_in: int, d_out: int, int8: bool = False) -> None:
        super().__init__(d_in, d_out, bias=False)
        self.int8 = int8
        self.k_groups = 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.int8:
            return F.linear(x, self.weight)
        if not isinstance(self.weight, DTensor):
            return Int8Matmul.apply(x, self.weight, self.k_groups)
        # local int8 matmul on this rank's shards; the result's placement is what the float matmul's would be
        w = self.weight
        column_parallel = w.placements[0] == Shard(0)
        # x's gradient on a column-parallel rank is its shard of the sum over the output columns: Partial
        grads = (Partial(),) if column_parallel else None
        local_x = x.to_local(grad_placements=grads) if isinstance(x, DTensor) else x
        out = Int8Matmul.apply(local_x, w.to_local())
        placement = Shard(out.ndim - 1) if column_parallel else Partial()
        return DTensor.from_local(out, w.device_mesh, (placement,), run_check=False)


class Attention(nn.Module):
    def __init__(self, d_model: int, heads: int, int8: bool) -> None:
        super().__init__()
        self.head_dim = d_model // heads
        self.q, self.k, self.v, self.out = (Linear(d_model, d_model, int8) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q, k, v = (lin(x).view(batch, seq, -1, self.head_dim).transpose(1, 2) for lin in (self.q, self.k, self.v))
        attention = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(attention.transpose(1, 2).reshape(batch, seq, -1))


class MLP(nn.Module):
    def __init__(self, d_model: int, int8: bool) -> None:
        super().__init__()
        self.up, self.down = Linear(d_model, 4 * d_model, int8), Linear(4 * d_model, d_model, int8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int, int8: bool) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attention, self.mlp = Attention(d_model, heads, int8), MLP(d_model, int8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, d_model: int, heads: int, layers: int, seq: int, int8: bool = False) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, d_model), nn.Embedding(seq, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads, int8) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
        x = self.tokens(tokens) + self.positions(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def init_weights(model: nn.Module) -> None:
    """GPT-2/3's init: normal(0, 0.02) weights, LayerNorms at identity. On DTensors each rank fills its own
    shards (DTensor's random ops would check that ranks' generators agree: a value read, which shape-only
    recording cannot do)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            p = p.to_local() if isinstance(p, DTensor) else p
            if "norm" in name:
                p.fill_(1.0 if name.endswith("weight") else 0.0)
            else:
                p.normal_(0.0, 0.02)


def parallelize(model: GPT, mesh: object, compile_blocks: bool, checkpoint: bool = False) -> None:
    """torchtitan's plan and order: TP + sequence parallel on mesh["tp"], activation checkpointing, per-block
    compile, FSDP2 on mesh["fsdp"]."""
    tp = mesh["tp"]
    parallelize_module(model, tp, {
        "tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "positions": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    })
    block_plan = {
        "norm1": SequenceParallel(), "norm2": SequenceParallel(),
        "attention": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "attention.q": ColwiseParallel(), "attention.k": ColwiseParallel(), "attention.v": ColwiseParallel(),
        "attention.out": RowwiseParallel(output_layouts=Shard(1)),
        "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "mlp.up": ColwiseParallel(), "mlp.down": RowwiseParallel(output_layouts=Shard(1)),
    }
    for i, block in enumerate(model.blocks):
        parallelize_module(block, tp, block_plan)
        if checkpoint:      # non-reentrant: the backward recomputes the block's activations
            block = model.blocks[i] = checkpoint_wrapper(block)
        if compile_blocks:
            block.compile(backend="tpu")
        fully_shard(block, mesh=mesh["fsdp"])
    fully_shard(model, mesh=mesh["fsdp"])
    blocks = list(model.blocks)
    for block, following in zip(blocks, blocks[1:]):    # all-gather the next block's weights while this one runs
        block.set_modules_to_forward_prefetch([following])


def load_full(model: nn.Module, reference: nn.Module) -> None:
    """Copy a whole (CPU) model's parameters into the sharded one, each rank its shards."""
    full = dict(reference.named_parameters())
    with torch.no_grad():
        for name, p in model.named_parameters():
            src = full[name.replace("._checkpoint_wrapped_module", "")].to(p.device)
            # src_data_rank=None: every rank holds the whole tensor and keeps its shards (no communication)
            p.to_local().copy_(distribute_tensor(src, p.device_mesh, p.placements, src_data_rank=None).to_local())


def train(model: nn.Module, batches: list[torch.Tensor], vocab: int, lr: float) -> list[float]:
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for tokens in batches:
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, vocab).float(), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss)
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), help="GPT-3 size (sizes given below override it)")
    small = {"layers": 2, "d_model": 64, "heads": 4, "seq": 16, "vocab": 128}
    for size in small:
        parser.add_argument(f"--{size.replace('_', '-')}", type=int, help=f"default: the preset's, else {small[size]}")
    parser.add_argument("--batch", type=int, default=2, help="sequences per fsdp rank")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--tp", type=int, default=0, help="tensor-parallel degree (default: 8 on big worlds, else 2)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="",
                        help="parameter dtype (default: bfloat16 with --preset, else float32)")
    parser.add_argument("--int8", action="store_true", help="int8 matmuls in every linear layer")
    parser.add_argument("--no-compile", action="store_true", help="run the blocks eagerly")
    parser.add_argument("--checkpoint", action="store_true", help="activation checkpointing per block")
    parser.add_argument("--check", action="store_true", help="compare with the same training on CPU")
    args = parser.parse_args()
    given = {k: getattr(args, k) for k in small if getattr(args, k) is not None}
    sizes = {**small, **PRESETS.get(args.preset or "", {}), **given}
    dtype = getattr(torch, args.dtype or ("bfloat16" if args.preset else "float32"))

    dist.init_process_group("tpusim")
    world, rank = dist.get_world_size(), dist.get_rank()
    tp = min(args.tp or (8 if world % 8 == 0 and world > 8 else 2 if world % 2 == 0 else 1), world)
    mesh = init_device_mesh("tpu", (world // tp, tp), mesh_dim_names=("fsdp", "tp"))

    def build() -> GPT:
        return GPT(sizes["vocab"], sizes["d_model"], sizes["heads"], sizes["layers"], sizes["seq"], args.int8)

    with torch.device("meta"):
        model = build().to(dtype)
    parallelize(model, mesh, compile_blocks=not args.no_compile, checkpoint=args.checkpoint)
    model.to_empty(device="tpu")
    torch.manual_seed(0)
    if args.check:
        reference = build().to(dtype)
        for block in reference.blocks:      # int8: quantise as the row-parallel shards do
            block.attention.out.k_groups = block.mlp.down.k_groups = tp
        init_weights(reference)
        load_full(model, reference)
    else:
        init_weights(model)

    # every tp rank of one fsdp row sees the same batch; fsdp rows see different ones
    def batches(row: int) -> list[torch.Tensor]:
        g = torch.Generator().manual_seed(1000 + row)
        return [torch.randint(0, sizes["vocab"], (args.batch, sizes["seq"] + 1), generator=g)
                for _ in range(args.steps)]

    fsdp_rank, rows = mesh["fsdp"].get_local_rank(), world // tp
    losses = train(model, [b.to("tpu") for b in batches(fsdp_rank)], sizes["vocab"], lr=0.1)
    if os.environ.get("TPUSIM_NUMERICS", "on") != "off" and rank == 0:
        print(f"losses {[round(float(loss), 4) for loss in losses]} (mesh fsdp={rows} x tp={tp})")
    if args.check:
        whole = [torch.cat(parts) for parts in zip(*(batches(r) for r in range(rows)))]
        train(reference, whole, sizes["vocab"], lr=0.1)
        for (name, got), want in zip(model.named_parameters(), reference.parameters(), strict=True):
            torch.testing.assert_close(got.full_tensor().cpu(), want.detach(), rtol=1e-4, atol=1e-5,
                                       msg=lambda m, name=name: f"{name}: {m}")
        print(f"[rank {rank}] OK parameters equal the CPU run")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
