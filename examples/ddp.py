"""Data-parallel training with DistributedDataParallel, written for torchrun, on the simulated slice.

    python -m tpusim run examples/ddp.py --topology 2d:2x2                  # 4 processes, exact numerics
    python -m tpusim run examples/ddp.py --topology 3d:8x8x8 -- --width 1024   # rank 0 of 512, priced

Each rank trains on its own slice of every global batch; DDP averages the gradients with one
all-reduce per bucket, overlapped with the backward pass. Rank 0 prints the loss of its slice.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=16, help="samples per rank")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--depth", type=int, default=3)
    args = parser.parse_args()

    dist.init_process_group("tpusim")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)                                   # the same initial weights on every rank
    layers = []
    for _ in range(args.depth):
        layers += [nn.Linear(args.width, args.width), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(args.width, 1)).to("tpu")
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(100 + rank)  # every rank its own data
    readable = os.environ.get("TPUSIM_NUMERICS", "on") != "off"
    for step in range(args.steps):
        x = torch.randn(args.batch, args.width, generator=generator).to("tpu")
        y = x.sum(dim=1, keepdim=True).tanh()
        loss = nn.functional.mse_loss(ddp(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if rank == 0 and readable:
            print(f"step {step}: loss {loss.item():.4f} (rank 0 of {world})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
