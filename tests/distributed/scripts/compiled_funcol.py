"""Functional collectives inside one torch.compile(backend="tpu") graph, checked against CPU.

Every rank computes the CPU reference of every rank's contribution itself (same seeds), runs the
compiled function on tpu and prints "OK <name>" per matching output, then the compiled graphs.
``--size N``: the matmuls' side (large sizes are for --numerics off: pricing only); ``--gather-only``: just
the all-gather and the matmuls it can hide behind, run twice (the second call compiles nothing).
"""

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

parser = argparse.ArgumentParser()
parser.add_argument("--size", type=int, default=8)
parser.add_argument("--gather-only", action="store_true")
args = parser.parse_args()
size, rows = args.size, max(8, args.size // 32)

dist.init_process_group("tpusim")
rank, world = dist.get_rank(), dist.get_world_size()
group = dist.group.WORLD


def step(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    gathered = funcol.all_gather_tensor(x[:rows], 0, group)   # independent of the matmuls: may overlap them
    y = torch.relu(x @ w)
    y = torch.relu(y @ w)
    z = (gathered * 2).sum(0, keepdim=True)
    if args.gather_only:
        return y, z
    summed = funcol.all_reduce(y, "sum", group)
    scattered = funcol.reduce_scatter_tensor(y.repeat(world, 1), "sum", 0, group)
    return summed + 1, z, scattered


def inputs(r: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    base, w = torch.randn(size, size, generator=g), torch.randn(size, size, generator=g) / size**0.5
    return base + r, w


x, w = inputs(rank)
compiled = torch.compile(step, backend="tpu")
out = compiled(x.to("tpu"), w.to("tpu"))
if os.environ.get("TPUSIM_NUMERICS", "on") != "off":
    ys = [torch.relu(torch.relu(inputs(r)[0] @ w) @ w) for r in range(world)]
    want = (sum(ys) + 1, (torch.cat([inputs(r)[0][:rows] for r in range(world)]) * 2).sum(0, keepdim=True), sum(ys))
    for name, got, expected in zip(("all_reduce", "all_gather", "reduce_scatter"), out, want, strict=True):
        torch.testing.assert_close(got.cpu(), expected, rtol=1e-4, atol=1e-4)
        print(f"OK {name}")
else:                                   # numerics off: an eager reader of every output waits for its collective
    sum(o.sum() for o in out)
    sum(o.sum() for o in compiled(x.to("tpu"), w.to("tpu")))
from tpusim.backend.torch_compile.jax_backend import compile_stats  # noqa: E402

print("GRAPHS " + json.dumps([{"lowered": g.lowered, "segments": g.segments, "collectives": g.collectives}
                              for g in compile_stats().graphs]))
dist.destroy_process_group()
