import torch
import torch.distributed as dist

dist.init_process_group("tpusim")
x = torch.ones(4, device="tpu")
if dist.get_rank() == 1:
    raise ValueError("rank 1 fails on purpose")
dist.all_reduce(x)
