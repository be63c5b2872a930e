import time

import torch
import torch.distributed as dist

dist.init_process_group("tpusim")
if dist.get_rank() == 0:
    dist.isend(torch.ones(4, device="tpu"), 1)     # never waited for; the script ends: it moves at exit
else:
    time.sleep(1)                                  # rank 0 has ended its script by now
    got = torch.zeros(4, device="tpu")
    dist.irecv(got, 0).wait()
    print("GOT", got.tolist())
