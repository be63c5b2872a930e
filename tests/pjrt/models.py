"""Models of the PJRT/compile tests and the benchmark: an elementwise-heavy MLP and a small transformer.

Dropout is 0 so compiled runs (jax PRNG) and CPU runs draw no random numbers and must agree.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ElementwiseMLP(nn.Module):
    """Linear layers separated by chains of cheap elementwise ops: where per-op dispatch dominates."""

    def __init__(self, dim: int = 64, depth: int = 3, out: int = 10) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(dim, dim) for _ in range(depth))
        self.scale = nn.Parameter(torch.ones(dim))
        self.head = nn.Linear(dim, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            h = layer(x)
            h = F.gelu(h) * torch.sigmoid(h) + 0.1 * torch.tanh(h)
            h = h * self.scale - h.mean(dim=-1, keepdim=True)
            x = x + F.silu(h) / (1.0 + h.abs())
        return self.head(x)


class SmallTransformer(nn.Module):
    """Embedding, pre-norm encoder layers (SDPA attention, GELU MLP), vocabulary head."""

    def __init__(self, vocab: int = 64, dim: int = 32, heads: int = 4, layers: int = 2, seq: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(seq, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens) + self.pos))


def mlp_batch(batch: int = 32, dim: int = 64, out: int = 10, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, dim, generator=g), torch.randint(0, out, (batch,), generator=g)


def transformer_batch(batch: int = 4, seq: int = 16, vocab: int = 64,
                      seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, seq), generator=g), torch.randint(0, vocab, (batch * seq,), generator=g)


def train(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor], steps: int, device: str,
          step_fn: object = None) -> list[float]:
    """SGD-with-momentum training losses of ``model`` on ``device`` (the model is moved there)."""
    model = model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = (t.to(device) for t in batch)
    forward = step_fn if step_fn is not None else model
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        out = forward(x)
        loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses
