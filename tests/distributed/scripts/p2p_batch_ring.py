import json

import torch
import torch.distributed as dist

dist.init_process_group("tpusim")
rank, n = dist.get_rank(), dist.get_world_size()
right, left = (rank + 1) % n, (rank - 1) % n
floats = torch.arange(6.0, device="tpu").reshape(2, 3) + 100 * rank
ints = torch.tensor([rank, rank * rank], device="tpu")
got_floats, got_ints = torch.empty(2, 3, device="tpu"), torch.empty(2, dtype=torch.int64, device="tpu")
ops = [dist.P2POp(dist.isend, floats, right), dist.P2POp(dist.isend, ints, left),
       dist.P2POp(dist.irecv, got_floats, left), dist.P2POp(dist.irecv, got_ints, right)]
for work in dist.batch_isend_irecv(ops):
    work.wait()
print("RECEIVED", json.dumps([got_floats.cpu().tolist(), got_ints.cpu().tolist()]))
