"""A decoder-only LLM trained the way a PyTorch user would write a published TPU run (tpusim validate's script).

Plain torch.distributed and torchtitan's recipe: a Llama- or GPT-3-style decoder built on the meta device,
tensor parallel (optional, mesh dim "tp") through DTensor, each block activation-checkpointed as the
published remat policy says and ``torch.compile``'d (backend "tpu"), then sharded with FSDP2
(``fully_shard``) over mesh dim "fsdp"; bf16 parameters, AdamW, the loss in f32. (FSDP2's
``MixedPrecisionPolicy`` with f32 master weights would be closer to MaxText's f32 weights, but with it the
per-block ``compile`` is skipped: the difference is the optimizer's few milliseconds.)
``tpusim validate`` runs it with ``--numerics off`` through ``tpusim run``'s own pipeline, one case per
published configuration (``tpusim/validate/product.py`` says which flags each one takes).

    python -m tpusim run validation/decoder.py --topology 3d:4x4x4 --numerics off -- \\
        --layers 32 --d-model 8192 --heads 64 --mlp-dim 28672 --batch 6 --tp 4 --remat dots

``--remat``: ``none`` keeps every activation; ``full`` recomputes the whole block in the backward pass
(MaxText ``full``); ``dots`` keeps the outputs of the block's matmuls and recomputes the rest (MaxText
``minimal``: ``checkpoint_dots_with_no_batch_dims``); ``qkv`` keeps only the q/k/v projections' outputs and
recomputes the rest (the offloading policies of the Trillium recipes: their saved tensors go to host
memory, so the TensorCore's work is the same as keeping them). ``--attention masked`` passes the causal
mask as a tensor, so the flash kernel computes every block (MaxText's 2023 Pallas kernel, called with
``causal=False``). ``--compile none`` runs the whole step eagerly (the eager-mode recipes), ``blocks`` (the
default) compiles each block. ``--int8``: every projection matmul in int8
(``torch._int_mm``, per-row and per-channel scales, a straight-through backward), as AQT int8 training does.
"""

from __future__ import annotations

import argparse
import functools

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.nn import functional as F
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

REMAT = ("none", "full", "dots", "qkv")


class QuantisedMatmul(torch.autograd.Function):
    """x @ w.T with x's rows and w's output channels in int8 (absmax scales); the backward is the float
    matmuls' (straight-through), as int8 training recipes do."""

    @staticmethod
    def forward(ctx: object, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        rows = x.reshape(-1, x.shape[-1])
        row_scale = rows.abs().amax(1, keepdim=True).clamp(min=1e-8) / 127
        col_scale = w.abs().amax(1, keepdim=True).clamp(min=1e-8) / 127
        qx = (rows / row_scale).round().clamp(-127, 127).to(torch.int8)
        qw = (w / col_scale).round().clamp(-127, 127).to(torch.int8)
        out = torch._int_mm(qx, qw.t()).to(x.dtype) * row_scale * col_scale.t()
        return out.reshape(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, w = ctx.saved_tensors
        return grad @ w, grad.reshape(-1, grad.shape[-1]).t() @ x.reshape(-1, x.shape[-1])


class Linear(nn.Linear):
    """A bias-free projection, in int8 when asked (tensor-parallel plans accept it: it is an nn.Linear)."""

    def __init__(self, d_in: int, d_out: int, int8: bool = False) -> None:
        super().__init__(d_in, d_out, bias=False)
        self.int8 = int8

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return QuantisedMatmul.apply(x, self.weight) if self.int8 else F.linear(x, self.weight)


def rotary(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotary position embedding over the last dim of [batch, heads, seq, head_dim] (the rotate-half form)."""
    seq, dim = x.shape[-2], x.shape[-1]
    inv = 1.0 / base ** (torch.arange(0, dim, 2, device=x.device, dtype=torch.float32) / dim)
    angles = torch.outer(torch.arange(seq, device=x.device, dtype=torch.float32), inv)
    cos, sin = angles.cos().repeat(1, 2).to(x.dtype), angles.sin().repeat(1, 2).to(x.dtype)
    half = torch.cat((-x[..., dim // 2:], x[..., : dim // 2]), dim=-1)
    return x * cos + half * sin


class Attention(nn.Module):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.rope = args.heads, args.kv_heads, args.head_dim, args.rope
        self.masked = args.attention == "masked"
        q, kv = args.heads * args.head_dim, args.kv_heads * args.head_dim
        self.q, self.k, self.v = (Linear(args.d_model, n, args.int8) for n in (q, kv, kv))
        self.out = Linear(q, args.d_model, args.int8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q, k, v = (lin(x).view(batch, seq, -1, self.head_dim).transpose(1, 2) for lin in (self.q, self.k, self.v))
        if self.rope:
            q, k = rotary(q), rotary(k)
        gqa = self.kv_heads != self.heads
        if self.masked:       # a kernel that computes every block and masks the scores (MaxText's 2023 flash)
            mask = torch.ones(seq, seq, dtype=torch.bool, device=x.device).tril()
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        else:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        return self.out(o.transpose(1, 2).reshape(batch, seq, -1))


class MLP(nn.Module):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.kind = args.mlp
        self.up = Linear(args.d_model, args.mlp_dim, args.int8)
        self.gate = Linear(args.d_model, args.mlp_dim, args.int8) if args.mlp == "swiglu" else None
        self.down = Linear(args.mlp_dim, args.d_model, args.int8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate is not None:
            return self.down(F.silu(self.gate(x)) * self.up(x))
        hidden = self.up(x)
        return self.down(F.gelu(hidden, approximate="tanh") if self.kind == "gelu" else F.relu(hidden))


def norm(args: argparse.Namespace) -> nn.Module:
    return nn.RMSNorm(args.d_model) if args.norm == "rms" else nn.LayerNorm(args.d_model, bias=False)


class Block(nn.Module):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.norm1, self.norm2 = norm(args), norm(args)
        self.attention, self.mlp = Attention(args), MLP(args)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Decoder(nn.Module):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.tokens = nn.Embedding(args.vocab, args.d_model)
        self.positions = None if args.rope else nn.Embedding(args.seq, args.d_model)
        self.blocks = nn.ModuleList(Block(args) for _ in range(args.layers))
        self.norm = norm(args)
        self.head = nn.Linear(args.d_model, args.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tokens(tokens)
        if self.positions is not None:
            x = x + self.positions(torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def _keep(saved: int | None, per_block: int, counts: dict[bool, int], ctx: object, op: object, *args: object,
          **kwargs: object) -> CheckpointPolicy:
    """Selective checkpointing: keep matmul outputs (all of them, or the first ``saved`` of the ``per_block``
    matmuls of each block's forward: q, k, v), recompute everything else. The forward and the recompute
    count apart, so both passes decide alike (torchtitan's per-op policy does the same)."""
    if op not in (torch.ops.aten.mm.default, torch.ops.aten._int_mm.default, torch.ops.aten.addmm.default):
        return CheckpointPolicy.PREFER_RECOMPUTE
    if saved is None:
        return CheckpointPolicy.MUST_SAVE
    index = counts.get(ctx.is_recompute, 0)
    counts[ctx.is_recompute] = index + 1
    return CheckpointPolicy.MUST_SAVE if index % per_block < saved else CheckpointPolicy.PREFER_RECOMPUTE


def checkpointed(block: nn.Module, args: argparse.Namespace) -> nn.Module:
    if args.remat == "none":
        return block
    if args.remat == "full":
        return checkpoint_wrapper(block)
    per_block = 4 + (3 if args.mlp == "swiglu" else 2)
    policy = functools.partial(_keep, None if args.remat == "dots" else 3, per_block, {})
    return checkpoint_wrapper(block, context_fn=functools.partial(create_selective_checkpoint_contexts, policy))


def parallelize(model: Decoder, mesh: object, args: argparse.Namespace) -> None:
    """torchtitan's order: tensor + sequence parallel on "tp", checkpointing, per-block compile, FSDP2."""
    if args.tp > 1:
        tp = mesh["tp"]
        plan = {"tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
                "norm": SequenceParallel(),
                "head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())}
        if model.positions is not None:
            plan["positions"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))
        parallelize_module(model, tp, plan)
        block_plan = {
            "norm1": SequenceParallel(), "norm2": SequenceParallel(),
            "attention": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "attention.q": ColwiseParallel(), "attention.k": ColwiseParallel(), "attention.v": ColwiseParallel(),
            "attention.out": RowwiseParallel(output_layouts=Shard(1)),
            "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "mlp.up": ColwiseParallel(), "mlp.down": RowwiseParallel(output_layouts=Shard(1)),
        }
        if args.mlp == "swiglu":
            block_plan["mlp.gate"] = ColwiseParallel()
        for block in model.blocks:
            parallelize_module(block, tp, block_plan)
    # several slices: FSDP inside each slice, replicated across the slices (HSDP): the gradient shards are
    # all-reduced over DCN after the reduce-scatter, as MaxText's dcn_data_parallelism does
    fsdp = mesh["dcn", "fsdp"] if args.dcn > 1 else mesh["fsdp"]
    for i, block in enumerate(model.blocks):
        block = model.blocks[i] = checkpointed(block, args)
        if args.compile == "blocks":
            block.compile(backend="tpu")
        fully_shard(block, mesh=fsdp)
    fully_shard(model, mesh=fsdp)
    blocks = list(model.blocks)
    for block, following in zip(blocks, blocks[1:]):    # all-gather the next block's weights while this one runs
        block.set_modules_to_forward_prefetch([following])


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, default in (("layers", 2), ("d-model", 256), ("heads", 4), ("kv-heads", 0), ("head-dim", 0),
                          ("mlp-dim", 0), ("vocab", 32000), ("seq", 128)):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--mlp", choices=("swiglu", "gelu", "relu"), default="swiglu")
    parser.add_argument("--norm", choices=("rms", "layer"), default="rms")
    parser.add_argument("--positions", choices=("rope", "learned"), default="rope")
    parser.add_argument("--attention", choices=("causal", "masked"), default="causal",
                        help="causal: the kernel skips the blocks above the diagonal; masked: it computes every "
                             "block and masks the scores")
    parser.add_argument("--batch", type=int, default=1, help="sequences per chip (MaxText's per_device_batch_size)")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (mesh dim 'tp')")
    parser.add_argument("--dcn", type=int, default=1,
                        help="data parallel over this many slices (mesh dim 'dcn'; `tpusim run --slices`)")
    parser.add_argument("--remat", choices=REMAT, default="full")
    parser.add_argument("--int8", action="store_true", help="int8 projection matmuls")
    parser.add_argument("--compile", choices=("blocks", "none"), default="blocks",
                        help="blocks: each block torch.compile'd (torchtitan's per-block compile); none: the whole "
                             "step in the eager mode tpusim run prices (TorchTPU's DEFER_AND_FUSE eager recipes)")
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    args.kv_heads = args.kv_heads or args.heads
    args.head_dim = args.head_dim or args.d_model // args.heads
    args.mlp_dim = args.mlp_dim or 4 * args.d_model
    args.rope = args.positions == "rope"
    return args


def main() -> None:
    args = arguments()
    dist.init_process_group("tpusim")
    world = dist.get_world_size()
    if world % (args.tp * args.dcn):
        raise SystemExit(f"--tp {args.tp} x --dcn {args.dcn} does not divide the {world} chips")
    mesh = init_device_mesh("tpu", (args.dcn, world // args.tp // args.dcn, args.tp),
                            mesh_dim_names=("dcn", "fsdp", "tp"))
    with torch.device("meta"):
        model = Decoder(args).to(torch.bfloat16)
    parallelize(model, mesh, args)
    model.to_empty(device="tpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    # a tensor-parallel group works on its chips' sequences together: batch x tp per fsdp rank
    tokens = torch.randint(0, args.vocab, (args.batch * args.tp, args.seq + 1), device="tpu")
    for _ in range(args.steps):
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, args.vocab).float(), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
