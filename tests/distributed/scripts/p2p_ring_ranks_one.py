"""A ring under --ranks one (rank 0 of 4): each rank isends to the next and irecvs from the previous."""
import json

import torch
import torch.distributed as dist

dist.init_process_group("tpusim")
rank, n = dist.get_rank(), dist.get_world_size()
right, left = (rank + 1) % n, (rank - 1) % n
mine = torch.arange(4.0, device="tpu") + 10
got = torch.full((4,), float("nan"), device="tpu")           # NaN: what an unfilled buffer would keep
sent, received = dist.isend(mine, right), dist.irecv(got, left)
mine.add_(100)                                                # after the isend: what left is the value at the call
sent.wait()
received.wait()
back = torch.full((3, 2), float("nan"), device="tpu").t()    # the other way round, a non-contiguous target
pending = [dist.irecv(back, right, tag=7), dist.isend(torch.arange(6.0, device="tpu").reshape(2, 3), left, tag=7)]
for work in pending:
    work.wait()
lonely = torch.full((5,), float("nan"), device="tpu")         # nothing of this shape is ever sent: zeros
dist.recv(lonely, left)
print("RECEIVED", json.dumps([got.cpu().tolist(), back.cpu().tolist(), lonely.cpu().tolist()]))
