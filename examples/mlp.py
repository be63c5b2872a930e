"""An elementwise-heavy MLP trained for a few steps: plain PyTorch, device "tpu".

    python -m tpusim run examples/mlp.py --topology 2d:2x2
    python examples/mlp.py --device cpu          # the same program on the CPU
"""

import argparse
import os

import torch
from torch import nn


def build_model(width: int, depth: int) -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.LayerNorm(width), nn.GELU(), nn.Dropout(0.0)]
    return nn.Sequential(*layers, nn.Linear(width, 10))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="tpu")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--depth", type=int, default=4)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = build_model(args.width, args.depth).to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randn(args.batch, args.width).to(args.device)
    labels = torch.randint(0, 10, (args.batch,)).to(args.device)
    for step in range(args.steps):
        loss = nn.functional.cross_entropy(model(data), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if os.environ.get("TPUSIM_NUMERICS", "on") != "off":     # shape-only runs have no values to print
            print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
