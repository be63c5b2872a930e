import json

import torch
import torch.distributed as dist

dist.init_process_group("tpusim")
rank, n = dist.get_rank(), dist.get_world_size()
right, left = (rank + 1) % n, (rank - 1) % n
mine = torch.arange(4.0, device="tpu") + 10 * rank
got = torch.empty(4, device="tpu")
dist.isend(mine, right)                            # never waited for: it moves at the rank's exit
dist.irecv(got, left).wait()
print("RECEIVED", json.dumps(got.cpu().tolist()), flush=True)
dist.isend(mine * 2, right, tag=1)                 # a second ring, neither side waited: both move at exit
dist.irecv(torch.empty(4, device="tpu"), left, tag=1)
