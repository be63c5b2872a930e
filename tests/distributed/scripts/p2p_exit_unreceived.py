import torch
import torch.distributed as dist

dist.init_process_group("tpusim")
if dist.get_rank() == 0:
    dist.isend(torch.ones(4, device="tpu"), 1)    # never waited for, never received, no destroy_process_group()
print("DONE", flush=True)                          # both ranks end the script normally
