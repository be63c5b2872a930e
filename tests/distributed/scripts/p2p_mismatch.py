import torch
import torch.distributed as dist

dist.init_process_group("tpusim")
if dist.get_rank() == 0:
    dist.send(torch.ones(4, device="tpu"), 1)
else:
    dist.recv(torch.empty(5, device="tpu"), 0)
