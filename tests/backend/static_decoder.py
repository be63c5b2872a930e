"""A hand-written decode loop with a static KV cache, as one writes it for torch.compile: every shape fixed
(a preallocated cache, written with ``index_copy_`` at a position tensor, attention masked by position), so
each decode step runs the same compiled graph. Used by tests/backend/test_generate.py in-process and as a
script under ``python -m tpusim run`` (it prints the generated tokens as JSON).

    python tests/backend/static_decoder.py --device cpu
"""

from __future__ import annotations

import argparse
import json

import torch
from torch import nn
from torch.nn import functional as F

VOCAB, PROMPT = 128, 8


class StaticDecoder(nn.Module):
    """A small LLaMA-shaped decoder (grouped-query attention, RMSNorm, SiLU MLP) over a preallocated cache."""

    def __init__(self, batch: int, max_len: int, d_model: int = 64, heads: int = 4, kv_heads: int = 2,
                 layers: int = 2) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, d_model // heads
        self.embed = nn.Embedding(VOCAB, d_model)
        self.norms = nn.ModuleList(nn.RMSNorm(d_model) for _ in range(layers))
        self.qkv = nn.ModuleList(nn.Linear(d_model, (heads + 2 * kv_heads) * self.head_dim, bias=False)
                                 for _ in range(layers))
        self.out = nn.ModuleList(nn.Linear(d_model, d_model, bias=False) for _ in range(layers))
        self.mlp = nn.ModuleList(
            nn.Sequential(nn.Linear(d_model, 2 * d_model), nn.SiLU(), nn.Linear(2 * d_model, d_model))
            for _ in range(layers))
        self.norm = nn.RMSNorm(d_model)
        self.head = nn.Linear(d_model, VOCAB, bias=False)
        cache_shape = (layers, batch, kv_heads, max_len, self.head_dim)
        self.register_buffer("keys", torch.zeros(cache_shape))
        self.register_buffer("values", torch.zeros(cache_shape))

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        batch, seq = tokens.shape
        x = self.embed(tokens)
        visible = torch.arange(self.keys.shape[3], device=tokens.device) <= positions[:, None]
        split = [self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim]
        for layer, (norm, qkv, out, mlp) in enumerate(zip(self.norms, self.qkv, self.out, self.mlp)):
            q, k, v = qkv(norm(x)).split(split, dim=-1)
            q = q.view(batch, seq, self.heads, self.head_dim).transpose(1, 2)
            k = k.view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
            v = v.view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
            self.keys[layer].index_copy_(2, positions, k)            # this step's keys and values, in place
            self.values[layer].index_copy_(2, positions, v)
            attended = F.scaled_dot_product_attention(q, self.keys[layer], self.values[layer], attn_mask=visible,
                                                      enable_gqa=True)
            x = x + out(attended.transpose(1, 2).reshape(batch, seq, -1))
            x = x + mlp(x)
        return self.head(self.norm(x))


def generate(device: str, compile_steps: bool, batch: int = 2, new_tokens: int = 6) -> list[list[int]]:
    """Greedy tokens: the prompt's prefill eagerly, then ``new_tokens - 1`` decode steps (compiled when asked)."""
    torch.manual_seed(0)
    model = StaticDecoder(batch, PROMPT + new_tokens).to(device)
    prompt = torch.randint(1, VOCAB, (batch, PROMPT), generator=torch.Generator().manual_seed(1)).to(device)
    step = torch.compile(model, backend="tpu", fullgraph=True) if compile_steps else model
    with torch.no_grad():
        token = model(prompt, torch.arange(PROMPT, device=device))[:, -1:].argmax(-1)
        tokens = [token]
        for position in range(PROMPT, PROMPT + new_tokens - 1):
            token = step(token, torch.tensor([position], device=device))[:, -1:].argmax(-1)
            tokens.append(token)
    return torch.cat(tokens, dim=1).cpu().tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="tpu")
    parser.add_argument("--eager", action="store_true", help="decode steps without torch.compile")
    args = parser.parse_args()
    print(json.dumps(generate(args.device, compile_steps=not args.eager)))


if __name__ == "__main__":
    main()
