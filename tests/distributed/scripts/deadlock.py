import torch
import torch.distributed as dist

dist.init_process_group("tpusim")
rank = dist.get_rank()
pair = dist.new_group([0, 1])
x = torch.ones(4, device="tpu")
if rank == 0:
    dist.all_reduce(x, group=pair)     # rank 1 waits on the world group instead
else:
    dist.all_reduce(x)
