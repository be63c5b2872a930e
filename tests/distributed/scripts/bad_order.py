import torch
import torch.distributed as dist

dist.init_process_group("tpusim")
x = torch.ones(4, device="tpu")
out = [torch.empty(4, device="tpu") for _ in range(dist.get_world_size())]
if dist.get_rank() == 1:
    dist.all_gather(out, x)
    dist.all_reduce(x)
else:
    dist.all_reduce(x)
    dist.all_gather(out, x)
