"""Small models for the real-program tests (trained on tpu and CPU side by side)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(20, 64), nn.GELU(), nn.Dropout(0.1), nn.Linear(64, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, stride=2, padding=1, groups=2), nn.BatchNorm2d(16), nn.ReLU(),
            nn.AvgPool2d(2))
        self.head = nn.Linear(16 * 2 * 2, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class GPTBlock(nn.Module):
    """A GPT-style block: causal scaled_dot_product_attention + MLP, pre-norm."""

    def __init__(self, vocab: int = 50, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, dim)
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(approximate="tanh"), nn.Linear(4 * dim, dim))
        self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.1,
                                                                        batch_first=True), 1)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=0.1 if self.training else 0.0)
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, d))
        x = x + self.mlp(self.ln2(x))
        return self.head(self.encoder(x)).flatten(0, 1)


class Recommender(nn.Module):
    """Embedding-bag recommendation model (sum and mean bags) with a dense tower."""

    def __init__(self) -> None:
        super().__init__()
        self.users = nn.EmbeddingBag(100, 16, mode="sum")
        self.items = nn.EmbeddingBag(200, 16, mode="mean")
        self.dense = nn.Linear(4, 16)
        self.top = nn.Sequential(nn.Linear(48, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, dense: torch.Tensor, users: torch.Tensor, items: torch.Tensor,
                offsets: torch.Tensor) -> torch.Tensor:
        feats = [self.dense(dense), self.users(users, offsets), self.items(items, offsets)]
        return self.top(torch.cat(feats, dim=1)).squeeze(1)
