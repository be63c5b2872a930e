import torch
import torch.distributed as dist

dist.init_process_group("tpusim")
x = torch.ones(4, device="tpu")
if dist.get_rank() == 0:
    dist.send(x, 1)                    # rank 1 never receives it
dist.barrier()
