"""A LoRA fine-tune of a grouped-query decoder with key/value reuse, as the TorchTitan TPU recipes run AFMv7 3B.

tpusim validate's per-eager-mode cases: the public AFMv7 3B LoRA rows of Google's torchtitan fork
(``torchtitan/experiments/tpu/recipes/trillium/afmv7_lora/``) are timed in ``torch.compile`` (each layer
compiled, the rest in Fused eager) and in TorchTPU's DEFER_AND_FUSE eager (nothing compiled), so this script
runs the step either way (``--compile layers`` or ``none``) and `tpusim run --mode fused` prices it.

What the recipe's model and trainer do, written as a PyTorch user would (the model's args and the trainer's
config: tpusim/validate/eager_cases.py names the files):

- a decoder of ``--layers`` layers, the last ``--kv-reuse`` of which compute only queries and reuse the keys
  and values of the last regular layer (AFMv7's key/value reuse); grouped-query attention, RMSNorm (fp32
  compute) before attention and MLP and on each head's queries and keys, rotary positions, a SwiGLU MLP, the
  embedding tied to the output head;
- LoRA on every projection (q, k, v, o, and the MLP's gate, up, down): the base weights bf16 and frozen, the
  rank-``--lora-rank`` adapters float32 and the only trainable parameters, cast to bf16 for the matmuls;
- attention through TorchTPU's splash kernel (``torch.tpu.ops.splash_attention``), K/V first repeated to every
  query head as the recipe's model does before calling it;
- the loss as the recipe's fused linear + cross-entropy kernel computes it: the tied head and the softmax over
  ``--loss-chunk`` tokens at a time, recomputed in the backward pass (checkpointed chunks), so the full
  (tokens, vocab) logits never exist at once;
- full activation checkpointing of every layer, FSDP2 over every chip with no resharding after the forward,
  a sync between forward and backward (the recipe's ``use_graph_split``), AdamW over the adapters.

Not modelled, each small beside a step: SimpleFSDP's all-gathers (priced as FSDP2's), the adapters' DDP
replication on the smaller slices, gradient clipping.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from decoder import rotary  # validation/decoder.py, beside this script (its folder is sys.path[0])
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from torch_tpu._internal.sync import sync


class LoRALinear(nn.Module):
    """A frozen bias-free projection plus a trainable low-rank update (alpha = rank: scale 1)."""

    def __init__(self, d_in: int, d_out: int, rank: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(d_out, d_in, dtype=torch.bfloat16), requires_grad=False)
        self.lora_a = nn.Parameter(torch.empty(rank, d_in, dtype=torch.float32))
        self.lora_b = nn.Parameter(torch.empty(d_out, rank, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        low = F.linear(x, self.lora_a.to(x.dtype))
        return F.linear(x, self.weight) + F.linear(low, self.lora_b.to(x.dtype))


class RMSNorm(nn.Module):
    """RMSNorm computed in float32, its weight frozen."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, dtype=torch.bfloat16), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide = x.float()
        wide = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + 1e-6)
        return wide.to(x.dtype) * self.weight


class Attention(nn.Module):
    """Grouped-query attention; ``reuse``: only the queries are projected, the keys and values come in."""

    def __init__(self, args: argparse.Namespace, reuse: bool) -> None:
        super().__init__()
        self.args, self.reuse = args, reuse
        d, kv = args.d_model, args.kv_heads * args.head_dim
        self.q = LoRALinear(d, args.heads * args.head_dim, args.lora_rank)
        self.o = LoRALinear(args.heads * args.head_dim, d, args.lora_rank)
        self.q_norm = RMSNorm(args.head_dim)
        if not reuse:
            self.k, self.v = LoRALinear(d, kv, args.lora_rank), LoRALinear(d, kv, args.lora_rank)
            self.k_norm = RMSNorm(args.head_dim)

    def forward(self, x: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor] | None
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        a = self.args
        batch, seq, _ = x.shape
        q = rotary(self.q_norm(self.q(x).view(batch, seq, a.heads, a.head_dim)).transpose(1, 2), base=a.rope_theta)
        if kv is None:
            k = self.k_norm(self.k(x).view(batch, seq, a.kv_heads, a.head_dim)).transpose(1, 2)
            k = rotary(k, base=a.rope_theta)
            v = self.v(x).view(batch, seq, a.kv_heads, a.head_dim).transpose(1, 2)
            kv = (k, v)
        group = a.heads // a.kv_heads
        k, v = (t.repeat_interleave(group, dim=1) for t in kv)
        o = torch.tpu.ops.splash_attention(q, k, v, is_causal=True)
        return self.o(o.transpose(1, 2).reshape(batch, seq, -1)), kv


class Layer(nn.Module):
    def __init__(self, args: argparse.Namespace, reuse: bool) -> None:
        super().__init__()
        d, hidden, rank = args.d_model, args.mlp_dim, args.lora_rank
        self.attention_norm, self.mlp_norm = RMSNorm(d), RMSNorm(d)
        self.attention = Attention(args, reuse)
        self.gate, self.up, self.down = LoRALinear(d, hidden, rank), LoRALinear(d, hidden, rank), \
            LoRALinear(hidden, d, rank)

    def forward(self, x: torch.Tensor, k: torch.Tensor | None = None, v: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out, (k, v) = self.attention(self.attention_norm(x), None if k is None else (k, v))
        x = x + out
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h)), k, v


class Decoder(nn.Module):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.args = args
        self.embedding = nn.Embedding(args.vocab, args.d_model, dtype=torch.bfloat16)
        self.embedding.weight.requires_grad_(False)
        regular = args.layers - args.kv_reuse
        self.layers = nn.ModuleList(Layer(args, reuse=i >= regular) for i in range(args.layers))
        self.norm = RMSNorm(args.d_model)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The loss: the final hidden states through the tied head (``chunked_loss``)."""
        x, k, v = self.embedding(tokens), None, None
        for layer in self.layers:
            x, k, v = layer(x, k, v)
        return chunked_loss(self.norm(x), self.embedding.weight, targets, self.args.loss_chunk)


def _chunk_loss(hidden: torch.Tensor, head: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = F.linear(hidden, head).float()
    return F.cross_entropy(logits, targets, reduction="sum")


def chunked_loss(hidden: torch.Tensor, head: torch.Tensor, targets: torch.Tensor, chunk: int) -> torch.Tensor:
    """Mean cross-entropy of the tied head's logits, ``chunk`` tokens at a time, each chunk recomputed in the
    backward pass (the fused linear + cross-entropy kernel's work and memory)."""
    flat, labels = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    total = sum(checkpoint(_chunk_loss, flat[i:i + chunk], head, labels[i:i + chunk], use_reentrant=False)
                for i in range(0, flat.shape[0], chunk))
    return total / labels.numel()


def parallelize(model: Decoder, mesh: object, args: argparse.Namespace) -> None:
    """The recipe's order: full activation checkpointing, per-layer compile (``--compile layers``), FSDP2."""
    for i, layer in enumerate(model.layers):
        layer = model.layers[i] = checkpoint_wrapper(layer, preserve_rng_state=False)
        if args.compile == "layers":
            layer.compile(backend="tpu", fullgraph=True, dynamic=False)
        fully_shard(layer, mesh=mesh, reshard_after_forward=False)
    fully_shard(model, mesh=mesh, reshard_after_forward=False)


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, default in (("layers", 4), ("kv-reuse", 1), ("d-model", 256), ("heads", 4), ("kv-heads", 2),
                          ("head-dim", 0), ("mlp-dim", 0), ("vocab", 32000), ("seq", 256), ("lora-rank", 16),
                          ("loss-chunk", 2048), ("batch", 1), ("steps", 3)):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--rope-theta", type=float, default=500000.0)
    parser.add_argument("--compile", choices=("layers", "none"), default="layers",
                        help="layers: each layer torch.compile'd (the recipes' compile rows); none: the whole step "
                             "in the eager mode tpusim run prices (their DEFER_AND_FUSE rows)")
    args = parser.parse_args()
    args.head_dim = args.head_dim or args.d_model // args.heads
    args.mlp_dim = args.mlp_dim or 4 * args.d_model
    if args.heads % args.kv_heads or not 0 <= args.kv_reuse < args.layers:
        parser.error("--kv-heads must divide --heads, and --kv-reuse be below --layers")
    return args


def main() -> None:
    args = arguments()
    dist.init_process_group("tpusim")
    mesh = init_device_mesh("tpu", (dist.get_world_size(),), mesh_dim_names=("fsdp",))
    with torch.device("meta"):
        model = Decoder(args)
    parallelize(model, mesh, args)
    model.to_empty(device="tpu")
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-4, foreach=True)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), device="tpu")
    for _ in range(args.steps):
        loss = model(tokens[:, :-1], tokens[:, 1:])
        sync.synchronize(loss, wait=False)     # the recipe's graph split between forward + loss and backward
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
