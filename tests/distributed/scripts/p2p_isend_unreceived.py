import torch
import torch.distributed as dist

dist.init_process_group("tpusim")
peer = 1 - dist.get_rank()
work = dist.isend(torch.ones(4, device="tpu"), peer)   # neither rank ever posts the irecv
print("POSTED", flush=True)                             # the isend call itself does not block
work.wait()
