import torch
import torch.distributed as dist

dist.init_process_group("tpusim")
if dist.get_rank() == 0:
    dist.isend(torch.ones(4, device="tpu"), 1)    # never waited for, and rank 1 never receives it
dist.barrier()                                     # both ranks get past this: the isend does not block it
print("PASSED BARRIER", flush=True)
dist.destroy_process_group()                       # rank 0 blocks here on the isend
