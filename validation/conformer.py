"""A Conformer trained with CTC loss, data parallel, as the TorchTitan TPU recipes run their Conformer.

tpusim validate's per-eager-mode cases: the public Conformer rows of Google's torchtitan fork
(``torchtitan/experiments/tpu/recipes/trillium/conformer/v6e-8/README.md``) are timed with each layer
``torch.compile``'d (the rest in TorchTPU's default eager, DEFER_NEVER) and in DEFER_AND_FUSE eager (nothing
compiled), so this script runs the step either way (``--compile layers`` or ``none``) and `tpusim run --mode
strict|fused` prices it.

What the recipe's model and trainer do at the recipe's date (``conformer/model.py``, ``infra/parallelize.py``
and ``train_minimal.py`` @ debda64), written as a PyTorch user would:

- token ids (vocabulary ``--vocab``) through an embedding (no subsampling front end, no positional
  encoding: the recipe's model has none), ``--layers`` Conformer layers, a linear head to the vocabulary;
- each layer: ``x + 0.5 * ffn1(x)`` (LayerNorm, Linear to 4x, SiLU, Linear back), LayerNorm, multi-head
  self-attention, residual, the convolution module (LayerNorm, pointwise Conv1d to 2x, GLU as
  ``a * sigmoid(b)``, depthwise Conv1d of ``--kernel``, BatchNorm1d, SiLU, pointwise Conv1d), residual,
  ``x + 0.5 * ffn2(x)``, a final LayerNorm;
- attention as the recipe's ``PatchedMHA``: q, k and v by one einsum of the input with the in-projection
  weight viewed (3, heads, head_dim, dim) (its bias is never used, so it is not created here), the
  non-causal splash kernel (``torch.tpu.ops.splash_attention``), then the out-projection as one bmm per
  head with the head's slice of the weight expanded over the batch, summed, plus the bias;
- mixed precision as SimpleFSDP's policy: float32 weights, each cast to bfloat16 where it is used (inside
  the checkpointed and compiled layer; the modules below do the cast in their ``forward``), the BatchNorm
  running statistics float32, gradients reduced in float32;
- the loss: the logits in float32, log-softmax, CTC (``aten._ctc_loss``, blank 0) against random targets
  of ``--ctc-targets`` labels, summed;
- full activation checkpointing of every layer; the recipe's SimpleFSDP "replicate" mode as plain data
  parallel: every chip holds the whole model and each float32 gradient is all-reduced (averaged) as soon as
  it is complete, one all-reduce per parameter as SimpleFSDP's; AdamW (foreach); a sync at the end of each
  step (the recipe reads the loss back every step: ``--metrics.log_freq=1``).

Not modelled, small beside a step: the learning-rate warm-up. (torch's DistributedDataParallel would do the
same all-reduces in buckets, but its constructor reads parameter values, which `tpusim run --numerics off`
cannot.)
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.nn import functional as F

from torch_tpu._internal.sync import sync

BF16 = torch.bfloat16


class Linear(nn.Linear):
    """float32 weights, bfloat16 compute (SimpleFSDP's mixed-precision policy: each use casts the weight)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight.to(BF16), self.bias.to(BF16))


class LayerNorm(nn.LayerNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.normalized_shape, self.weight.to(BF16), self.bias.to(BF16), self.eps)


class Conv1d(nn.Conv1d):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(x, self.weight.to(BF16), self.bias.to(BF16))


class BatchNorm1d(nn.BatchNorm1d):
    """Batch statistics in training; the running statistics are buffers, kept float32 (the policy casts
    parameters only)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight.to(BF16), self.bias.to(BF16),
                            self.training, self.momentum, self.eps)


class FeedForward(nn.Sequential):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__(LayerNorm(dim), Linear(dim, hidden), nn.SiLU(), Linear(hidden, dim))


class SelfAttention(nn.Module):
    """The recipe's ``PatchedMHA``: einsum q/k/v, the splash kernel, a bmm per head for the out-projection."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.in_proj_weight = nn.Parameter(torch.empty(3 * dim, dim))
        self.out_proj = Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, _, dim = x.shape
        w = self.in_proj_weight.to(BF16).view(3, self.heads, self.head_dim, dim)
        q, k, v = torch.einsum("btd,nhkd->nbhtk", x, w)
        o = torch.tpu.ops.splash_attention(q, k, v, is_causal=False)
        w = self.out_proj.weight.to(BF16).view(dim, self.heads, self.head_dim)
        heads = [torch.bmm(o[:, i], w[:, i, :].t().unsqueeze(0).expand(batch, -1, -1)) for i in range(self.heads)]
        return sum(heads) + self.out_proj.bias.to(BF16)


class GLU(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = x.chunk(2, dim=1)
        return a * torch.sigmoid(b)


class Convolution(nn.Module):
    def __init__(self, dim: int, kernel: int) -> None:
        super().__init__()
        self.layer_norm = LayerNorm(dim)
        self.sequential = nn.Sequential(
            Conv1d(dim, 2 * dim, 1), GLU(), Conv1d(dim, dim, kernel, padding=kernel // 2, groups=dim),
            BatchNorm1d(dim), nn.SiLU(), Conv1d(dim, dim, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.sequential(self.layer_norm(x).transpose(1, 2)).transpose(1, 2)


class ConformerLayer(nn.Module):
    def __init__(self, dim: int, heads: int, kernel: int) -> None:
        super().__init__()
        self.ffn1, self.ffn2 = FeedForward(dim, 4 * dim), FeedForward(dim, 4 * dim)
        self.self_attn_layer_norm, self.final_layer_norm = LayerNorm(dim), LayerNorm(dim)
        self.self_attn = SelfAttention(dim, heads)
        self.conv_module = Convolution(dim, kernel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + 0.5 * self.ffn1(x)
        x = x + self.self_attn(self.self_attn_layer_norm(x))
        x = x + self.conv_module(x)
        x = x + 0.5 * self.ffn2(x)
        return self.final_layer_norm(x)


class Conformer(nn.Module):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.embedding = nn.Embedding(args.vocab, args.d_model)
        self.layers = nn.ModuleList(ConformerLayer(args.d_model, args.heads, args.kernel) for _ in range(args.layers))
        self.fc = Linear(args.d_model, args.vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = F.embedding(tokens, self.embedding.weight.to(BF16))
        for layer in self.layers:
            x = layer(x)
        return self.fc(x)


def ctc_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The recipe's loss: float32 log-softmax, (time, batch, classes), ``aten._ctc_loss`` summed."""
    log_probs = F.log_softmax(logits.float(), dim=-1).transpose(0, 1)
    batch, frames = logits.shape[:2]
    output_lengths = torch.full((batch,), frames, dtype=torch.long, device=logits.device)
    target_lengths = torch.full((batch,), targets.shape[1], dtype=torch.long, device=logits.device)
    loss, _ = torch.ops.aten._ctc_loss.Tensor(log_probs, targets, output_lengths, target_lengths, 0, False)
    return loss.sum()


def all_reduce_grad(param: torch.Tensor) -> None:
    """Data parallel as SimpleFSDP's replicate mode: each float32 gradient averaged over every chip."""
    dist.all_reduce(param.grad, op=dist.ReduceOp.AVG)


def parallelize(model: Conformer, args: argparse.Namespace) -> None:
    """The recipe's order: full activation checkpointing, per-layer compile (``--compile layers``), then data
    parallel over every chip (every chip the whole model; each gradient all-reduced when it is complete)."""
    for i, layer in enumerate(model.layers):
        layer = model.layers[i] = checkpoint_wrapper(layer, preserve_rng_state=False)
        if args.compile == "layers":
            layer.compile(backend="tpu", fullgraph=True, dynamic=False)
    for param in model.parameters():
        param.register_post_accumulate_grad_hook(all_reduce_grad)


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, default in (("layers", 4), ("d-model", 256), ("heads", 4), ("kernel", 31), ("vocab", 64),
                          ("seq", 256), ("ctc-targets", 30), ("batch", 2), ("steps", 3)):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--compile", choices=("layers", "none"), default="layers",
                        help="layers: each layer torch.compile'd (the recipe's compile row); none: the whole step "
                             "in the eager mode tpusim run prices (its DEFER_AND_FUSE row)")
    args = parser.parse_args()
    if args.d_model % args.heads or args.ctc_targets >= args.seq:
        parser.error("--heads must divide --d-model, and --ctc-targets be below --seq")
    return args


def main() -> None:
    args = arguments()
    dist.init_process_group("tpusim")
    with torch.device("meta"):
        model = Conformer(args)
    model.to_empty(device="tpu")
    parallelize(model, args)
    optimizer = torch.optim.AdamW(model.parameters(), lr=8e-4, foreach=True)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq), device="tpu")
    targets = torch.randint(1, args.vocab, (args.batch, args.ctc_targets), device="tpu")
    for _ in range(args.steps):
        optimizer.zero_grad()
        loss = ctc_loss(model(tokens), targets)
        loss.backward()
        optimizer.step()
        sync.synchronize(loss, wait=True)      # the recipe reads the loss back every step
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
