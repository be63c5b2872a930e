"""A GPT-style decoder trained on random tokens: plain PyTorch, device "tpu".

Sizes are flags, so the same script is a toy on a laptop or a large model priced in
shape-only mode (`--numerics off`):

    python -m tpusim run examples/transformer.py --topology 3d:8x8x8
    python -m tpusim run examples/transformer.py --numerics off -- --layers 24 --d-model 2048
    python -m tpusim run examples/transformer.py --mode all -- --compile   # torch.compile(backend="tpu")
"""

import argparse
import os

import torch
from torch import nn
from torch.nn import functional as F


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, d_model = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d_model, dim=-1)
        q, k, v = (t.view(batch, seq, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        attention = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attention.transpose(1, 2).reshape(batch, seq, d_model))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, d_model: int, heads: int, layers: int, seq: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.position = nn.Parameter(torch.zeros(seq, d_model))
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="tpu")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--compile", action="store_true", help='run the model through torch.compile(backend="tpu")')
    args = parser.parse_args()

    torch.manual_seed(0)
    model = GPT(args.vocab, args.d_model, args.heads, args.layers, args.seq).to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1)).to(args.device)
    forward = torch.compile(model, backend="tpu") if args.compile else model
    readable = os.environ.get("TPUSIM_NUMERICS", "on") != "off"      # shape-only runs have no values to print
    for step in range(args.steps):
        logits = forward(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if readable:
            print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
