"""Data parallel over slices: a 2-D mesh ('dcn', 'data'); each step all-reduces a gradient-sized buffer inside
the slice (ICI) and then across the slices (DCN), as hierarchical data parallelism does."""
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import tpusim.backend

SLICES = int(sys.argv[1])
MIB = int(sys.argv[2])

dist.init_process_group("tpu")
world = dist.get_world_size()
mesh = init_device_mesh("tpu", (SLICES, world // SLICES), mesh_dim_names=("dcn", "data"))
weight = torch.randn(1024, 1024, device="tpu")
grad = torch.empty(MIB * 2**20 // 4, device="tpu")
for _ in range(3):
    x = torch.randn(256, 1024, device="tpu")
    (x @ weight).sum()
    dist.all_reduce(grad, group=mesh["data"].get_group())
    dist.all_reduce(grad, group=mesh["dcn"].get_group())
    tpusim.backend.step()
