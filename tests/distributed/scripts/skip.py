import torch
import torch.distributed as dist

dist.init_process_group("tpusim")
x = torch.ones(4, device="tpu")
dist.all_reduce(x)
if dist.get_rank() != 1:
    dist.all_reduce(x)
