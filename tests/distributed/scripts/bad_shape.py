import torch
import torch.distributed as dist

dist.init_process_group("tpusim")
x = torch.ones(4 if dist.get_rank() == 0 else 5, device="tpu")
dist.all_reduce(x)
