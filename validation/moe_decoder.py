"""A Mixtral-style mixture-of-experts decoder trained the way a PyTorch user writes one (tpusim validate's script).

Every layer is GQA attention (``F.scaled_dot_product_attention(is_causal=True)``) and a dropping top-k MoE of
SwiGLU experts, written the usual way: a router linear, softmax, ``torch.topk``, ``F.one_hot``, each
routed token's position in its expert by a cumsum, then ``index_put`` into a capacity buffer
[experts, batch x capacity, d] (``--dispatch scatter``; ``einsum`` builds MaxText's one-hot dispatch and
combine tensors [batch, seq, experts, capacity] and contracts them, as MaxText's dense dropping MoE does),
batched expert matmuls (``torch.bmm``), and a combine with the gate weights. Capacity is per sequence, as
MaxText's: ``ceil(seq x top_k / experts x capacity_factor)`` slots per expert; a routed copy past it is dropped.

Parallelism: FSDP2 (``fully_shard``) over mesh dim "fsdp"; with ``--ep N`` > 1 the experts are split over mesh
dim "ep" and every layer sends each expert's slots to the chip that holds it, and back, by a functional
all-to-all (``torch.distributed._functional_collectives.all_to_all_single`` on ``mesh["ep"]``); the expert
weights are then sharded over "fsdp" only, everything else over all chips ("fsdp" x "ep" flattened), as
torchtitan does. Each block is activation-checkpointed and ``torch.compile``'d (backend "tpu"), as
validation/decoder.py's are. With ``--ep`` > 1 the experts' own ``fully_shard`` sits inside the compiled block,
and PyTorch breaks the graph at their FSDP2 hooks (under checkpointing the block then runs op by op): the
report's lint names it; docs/distributed.md says what to do.

    python -m tpusim run validation/moe_decoder.py --topology 2d:2x2 --numerics off -- --ep 2

``--remat``: ``none``, ``full`` (recompute the whole block), ``attention`` (keep the outputs of the attention's
q, k, v and out projections, recompute the rest: the Trillium Mixtral recipe offloads exactly those to host
memory). ``--check`` (numerics on, ``--ranks all``): float32, seeded weights, one step; every rank compares its
loss and every gradient with a CPU run of the whole model over every rank's batch and prints "OK ...".
"""

from __future__ import annotations

import argparse
import copy
import functools
import math

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Shard
from torch.nn import functional as F
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

REMAT = ("none", "full", "attention")
ATTENTION_MATMULS = 4               # q, k, v, out: the first matmuls of each block's forward


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
        self.head_dim, self.gqa = args.head_dim, args.kv_heads != args.heads
        q, kv = args.heads * args.head_dim, args.kv_heads * args.head_dim
        self.q, self.k, self.v = (nn.Linear(args.d_model, n, bias=False) for n in (q, kv, kv))
        self.out = nn.Linear(q, args.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q, k, v = (lin(x).view(batch, seq, -1, self.head_dim).transpose(1, 2) for lin in (self.q, self.k, self.v))
        o = F.scaled_dot_product_attention(rotary(q), rotary(k), v, is_causal=True, enable_gqa=self.gqa)
        return self.out(o.transpose(1, 2).reshape(batch, seq, -1))


class Experts(nn.Module):
    """This chip's experts' SwiGLU weights, stacked: one batched matmul runs them all."""

    def __init__(self, experts: int, d_model: int, mlp_dim: int) -> None:
        super().__init__()
        self.gate = nn.Parameter(torch.randn(experts, d_model, mlp_dim) / d_model**0.5)
        self.up = nn.Parameter(torch.randn(experts, d_model, mlp_dim) / d_model**0.5)
        self.down = nn.Parameter(torch.randn(experts, mlp_dim, d_model) / mlp_dim**0.5)

    def forward(self, slots: torch.Tensor) -> torch.Tensor:
        """[experts, slots, d] -> [experts, slots, d]."""
        return torch.bmm(F.silu(torch.bmm(slots, self.gate)) * torch.bmm(slots, self.up), self.down)


class MoE(nn.Module):
    """Top-k routing with a per-sequence capacity; the experts local or split over the "ep" mesh dim."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.num_experts, self.top_k, self.dispatch_kind = args.experts, args.top_k, args.dispatch
        self.capacity = math.ceil(args.seq * args.top_k / args.experts * args.capacity_factor)
        self.router = nn.Linear(args.d_model, args.experts, bias=False)
        self.experts = Experts(args.experts, args.d_model, args.mlp_dim)
        self.ep_group: object = None        # mesh["ep"] once the experts are split (``split_experts``)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = self.router(x).float().softmax(-1)
        weights, chosen = probs.topk(self.top_k, dim=-1)                      # [batch, seq, k]
        weights = (weights / weights.sum(-1, keepdim=True)).to(x.dtype)
        routed = F.one_hot(chosen, self.num_experts)                          # [batch, seq, k, experts]
        if self.dispatch_kind == "einsum":
            return self._einsum(x, routed, weights)
        return self._scatter(x, chosen, routed, weights)

    def _scatter(self, x: torch.Tensor, chosen: torch.Tensor, routed: torch.Tensor, weights: torch.Tensor
                 ) -> torch.Tensor:
        """index_put each kept copy into [experts, batch, capacity + 1, d] (the extra slot takes the dropped ones)."""
        batch, seq, d = x.shape
        # each routed copy's place in its expert's buffer: the copies in token order, per sequence
        routed = routed.reshape(batch, seq * self.top_k, self.num_experts)
        position = ((routed.cumsum(1) - 1) * routed).sum(-1)                  # [batch, seq x k]
        kept = position < self.capacity
        expert = chosen.reshape(batch, -1)
        row = torch.arange(batch, device=x.device).unsqueeze(1).expand_as(expert)
        slot = torch.where(kept, position, self.capacity)
        copies = x.unsqueeze(2).expand(batch, seq, self.top_k, d).reshape(batch, -1, d)
        buffer = x.new_zeros(self.num_experts, batch, self.capacity + 1, d)
        buffer = buffer.index_put((expert, row, slot), copies)
        slots = buffer[:, :, : self.capacity].reshape(self.num_experts, batch * self.capacity, d)
        out = F.pad(self._run_experts(slots).view(self.num_experts, batch, self.capacity, d), (0, 0, 0, 1))
        gathered = out[expert, row, slot] * (weights.reshape(batch, -1, 1) * kept.unsqueeze(-1))
        return gathered.view(batch, seq, self.top_k, d).sum(2)

    def _einsum(self, x: torch.Tensor, routed: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """MaxText's dense dropping MoE: one-hot dispatch and combine masks [batch, seq, experts, capacity]."""
        batch, seq, d = x.shape
        per_expert = routed.sum(2)                                            # [batch, seq, experts]: 0 or 1
        position = per_expert.cumsum(1) - 1                                   # a token routes to an expert once
        kept = (per_expert > 0) & (position < self.capacity)
        dispatch = ((position.unsqueeze(-1) == torch.arange(self.capacity, device=x.device)) &
                    kept.unsqueeze(-1)).to(x.dtype)                           # [batch, seq, experts, capacity]
        gate = (weights.unsqueeze(-1) * routed).sum(2)                        # [batch, seq, experts]
        slots = torch.einsum("bsec,bsd->ebcd", dispatch, x).reshape(self.num_experts, batch * self.capacity, d)
        out = self._run_experts(slots).view(self.num_experts, batch, self.capacity, d)
        return torch.einsum("bsec,ebcd->bsd", dispatch * gate.unsqueeze(-1), out)

    def _run_experts(self, slots: torch.Tensor) -> torch.Tensor:
        """[experts, slots, d] through the experts, each on the chip that holds it (an all-to-all there and back)."""
        if self.ep_group is None:
            return self.experts(slots)
        ep = self.ep_group.size()
        local = self.num_experts // ep
        received = funcol.all_to_all_single(slots.contiguous(), None, None, self.ep_group)   # [ep x local, n, d]
        mine = received.view(ep, local, -1, slots.shape[-1]).transpose(0, 1).reshape(local, -1, slots.shape[-1])
        done = self.experts(mine).view(local, ep, -1, slots.shape[-1]).transpose(0, 1).reshape(slots.shape)
        return funcol.all_to_all_single(done.contiguous(), None, None, self.ep_group)


class Block(nn.Module):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.RMSNorm(args.d_model), nn.RMSNorm(args.d_model)
        self.attention, self.moe = Attention(args), MoE(args)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.moe(self.norm2(x))


class Decoder(nn.Module):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.tokens = nn.Embedding(args.vocab, args.d_model)
        self.blocks = nn.ModuleList(Block(args) for _ in range(args.layers))
        self.norm = nn.RMSNorm(args.d_model)
        self.head = nn.Linear(args.d_model, args.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tokens(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def _keep_attention(counts: dict[bool, int], ctx: object, op: object, *args: object, **kwargs: object
                    ) -> CheckpointPolicy:
    """Keep the attention projections' outputs (each block's first four mm), recompute the rest; the forward
    and the recompute count apart, so both passes decide alike."""
    if op is not torch.ops.aten.mm.default:
        return CheckpointPolicy.PREFER_RECOMPUTE
    index = counts.get(ctx.is_recompute, 0)
    counts[ctx.is_recompute] = index + 1
    per_block = ATTENTION_MATMULS + 1                                      # and the router's
    return CheckpointPolicy.MUST_SAVE if index % per_block < ATTENTION_MATMULS else CheckpointPolicy.PREFER_RECOMPUTE


def checkpointed(block: nn.Module, remat: str) -> nn.Module:
    if remat == "none":
        return block
    if remat == "full":
        return checkpoint_wrapper(block)
    policy = functools.partial(_keep_attention, {})
    return checkpoint_wrapper(block, context_fn=functools.partial(create_selective_checkpoint_contexts, policy))


def split_experts(model: Decoder, mesh: object) -> None:
    """Keep this chip's experts (its coordinate on "ep") and route through mesh["ep"]."""
    ep = mesh["ep"]
    for block in model.blocks:
        moe = block.moe
        local = moe.num_experts // ep.size()
        first = ep.get_local_rank() * local
        for name, weight in moe.experts.named_parameters():
            setattr(moe.experts, name, nn.Parameter(weight.detach()[first:first + local].clone()))
        moe.ep_group = ep


def parallelize(model: Decoder, mesh: object, args: argparse.Namespace) -> None:
    """Experts split over "ep", checkpointing, per-block compile, FSDP2: the experts over "fsdp", the rest over all.
    The stacked expert weights shard on their d_model dim (MaxText's "embed" axis; torchtitan's Shard(1)): dim 0
    holds a few experts, and sharding it over more chips than that pads every chip's shard to a whole expert."""
    everyone = mesh["fsdp"]
    if args.ep > 1:
        split_experts(model, mesh)
        everyone = mesh["fsdp", "ep"]._flatten("dp")
    experts = {p for block in model.blocks for p in block.moe.experts.parameters()}
    placement = functools.partial(_expert_dim, experts)
    for i, block in enumerate(model.blocks):
        if args.ep > 1:     # each chip's expert gradients already sum its "ep" peers' tokens: divide by all chips
            fully_shard(block.moe.experts, mesh=mesh["fsdp"], shard_placement_fn=placement
                        ).set_gradient_divide_factor(mesh.size())
        block = model.blocks[i] = checkpointed(block, args.remat)
        if args.compile == "blocks":
            block.compile(backend="tpu")
        fully_shard(block, mesh=everyone, shard_placement_fn=placement)
    fully_shard(model, mesh=everyone)
    blocks = list(model.blocks)
    for block, following in zip(blocks, blocks[1:]):    # all-gather the next block's weights while this one runs
        block.set_modules_to_forward_prefetch([following])


def _expert_dim(experts: set[nn.Parameter], param: nn.Parameter) -> Shard | None:
    return Shard(1) if param in experts else None


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, default in (("layers", 2), ("d-model", 256), ("heads", 4), ("kv-heads", 2), ("head-dim", 0),
                          ("mlp-dim", 0), ("vocab", 32000), ("seq", 128), ("experts", 4), ("top-k", 2)):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--capacity-factor", type=float, default=1.25,
                        help="expert capacity = ceil(seq x top_k / experts x this) slots per sequence")
    parser.add_argument("--dispatch", choices=("scatter", "einsum"), default="scatter",
                        help="scatter: index_put into the capacity buffer; einsum: MaxText's one-hot dispatch/combine")
    parser.add_argument("--batch", type=int, default=1, help="sequences per chip (MaxText's per_device_batch_size)")
    parser.add_argument("--ep", type=int, default=1, help="expert-parallel degree (mesh dim 'ep')")
    parser.add_argument("--remat", choices=REMAT, default="full")
    parser.add_argument("--compile", choices=("blocks", "none"), default="blocks",
                        help="blocks: each block torch.compile'd; none: the whole step eagerly")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--check", action="store_true", help="float32, one step, loss and gradients against CPU")
    args = parser.parse_args()
    args.head_dim = args.head_dim or args.d_model // args.heads
    args.mlp_dim = args.mlp_dim or 4 * args.d_model
    if args.experts % args.ep:
        raise SystemExit(f"--ep {args.ep} does not divide the {args.experts} experts")
    if args.ep > 1 and args.remat == "attention":
        # the experts' FSDP2 hooks run inside the checkpointed block and issue more ops when the backward recomputes
        # it than in the forward, which selective checkpointing refuses (PyTorch's SAC, not the device)
        raise SystemExit("--remat attention with --ep > 1: selective checkpointing around the experts' own "
                         "fully_shard is refused by PyTorch; use --remat full or none")
    return args


def batch_of(rank: int, args: argparse.Namespace, device: str) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 + rank)
    return torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=generator).to(device)


def loss_of(model: nn.Module, tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, vocab).float(), tokens[:, 1:].reshape(-1))


def check(model: Decoder, reference: Decoder, args: argparse.Namespace) -> None:
    """This rank's loss, and every gradient (averaged over the ranks, as FSDP2 reduces them), against CPU."""
    rank, world = dist.get_rank(), dist.get_world_size()
    loss = loss_of(model, batch_of(rank, args, "tpu"), args.vocab)
    loss.backward()
    want = loss_of(reference, batch_of(rank, args, "cpu"), args.vocab)
    torch.testing.assert_close(loss.detach().cpu(), want.detach(), rtol=1e-4, atol=1e-4)
    print(f"OK loss {loss.item():.6f}")
    sum(loss_of(reference, batch_of(r, args, "cpu"), args.vocab) for r in range(world)).div(world).backward()
    ep_rank, local = rank % args.ep, args.experts // args.ep
    for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters(), strict=True):
        got = p.grad.full_tensor().cpu()
        expected = q.grad[ep_rank * local:(ep_rank + 1) * local] if ".experts." in name else q.grad
        torch.testing.assert_close(got, expected, rtol=1e-3, atol=1e-5, msg=name)
    print("OK gradients equal the CPU run")


def main() -> None:
    args = arguments()
    dist.init_process_group("tpusim")
    world = dist.get_world_size()
    if world % args.ep:
        raise SystemExit(f"--ep {args.ep} does not divide the {world} chips")
    mesh = init_device_mesh("tpu", (world // args.ep, args.ep), mesh_dim_names=("fsdp", "ep"))
    if args.check:
        torch.manual_seed(0)
        model = Decoder(args)
        reference = copy.deepcopy(model)
    else:
        with torch.device("meta"):
            model = Decoder(args).to(torch.bfloat16)
    parallelize(model, mesh, args)
    if args.check:
        check(model, reference, args)
        dist.destroy_process_group()
        return
    model.to_empty(device="tpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = batch_of(dist.get_rank(), args, "tpu")
    for _ in range(args.steps):
        loss = loss_of(model, tokens, args.vocab)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
