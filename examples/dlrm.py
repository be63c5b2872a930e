"""An embedding-heavy recommendation model (DLRM-style): SparseCores do the lookups.

    python -m tpusim run examples/dlrm.py --topology 3d:4x4x4
"""

import argparse
import os

import torch
from torch import nn


class DLRM(nn.Module):
    def __init__(self, tables: int, rows: int, dim: int, dense_features: int) -> None:
        super().__init__()
        self.embeddings = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum") for _ in range(tables))
        for bag in self.embeddings:     # DLRM's own init, U(-1/sqrt(rows), 1/sqrt(rows)): torch's N(0, 1) rows
            nn.init.uniform_(bag.weight, -rows ** -0.5, rows ** -0.5)   # summed 16 at a time blow the loss up
        self.bottom = nn.Sequential(nn.Linear(dense_features, dim), nn.ReLU())
        interactions = (tables + 1) * (tables + 2) // 2
        self.top = nn.Sequential(nn.Linear(interactions + dim, 256), nn.ReLU(), nn.Linear(256, 1))

    def forward(self, dense: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        x = self.bottom(dense)
        features = [x] + [bag(indices[t], offsets) for t, bag in enumerate(self.embeddings)]
        stacked = torch.stack(features, dim=1)
        products = stacked @ stacked.transpose(1, 2)
        rows, cols = torch.triu_indices(len(features), len(features))
        return self.top(torch.cat([x, products[:, rows, cols]], dim=1)).squeeze(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="tpu")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--tables", type=int, default=8)
    parser.add_argument("--rows", type=int, default=10000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--lookups", type=int, default=16, help="indices per bag")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = DLRM(args.tables, args.rows, args.dim, dense_features=13).to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    dense = torch.randn(args.batch, 13).to(args.device)
    indices = torch.randint(0, args.rows, (args.tables, args.batch * args.lookups)).to(args.device)
    offsets = (torch.arange(args.batch) * args.lookups).to(args.device)
    clicks = torch.randint(0, 2, (args.batch,)).float().to(args.device)
    for step in range(args.steps):
        loss = nn.functional.binary_cross_entropy_with_logits(model(dense, indices, offsets), clicks)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if os.environ.get("TPUSIM_NUMERICS", "on") != "off":     # shape-only runs have no values to print
            print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
