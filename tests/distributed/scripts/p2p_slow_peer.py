import time

import torch
import torch.distributed as dist

dist.init_process_group("tpusim")
if dist.get_rank() == 0:
    dist.send(torch.arange(4.0, device="tpu") * 3, 1)
    dist.send(torch.full((2,), 7.0, device="tpu"), 1, tag=5)
else:
    time.sleep(5)                      # still computing: rank 0 waits, and it is not a deadlock
    got = torch.empty(4, device="tpu")
    dist.recv(got, 0)
    tagged = torch.empty(2, device="tpu")
    dist.recv(tagged, 0, tag=5)
    print("RECEIVED", got.tolist(), tagged.tolist())
