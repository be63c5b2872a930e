import json

import torch
import torch.distributed as dist

dist.init_process_group("tpusim")
rank, n = dist.get_rank(), dist.get_world_size()
right, left = (rank + 1) % n, (rank - 1) % n
mine = torch.arange(4.0, device="tpu") + 10 * rank
got = torch.empty(4, device="tpu")
sent = dist.isend(mine, right)                 # every rank sends first: completes when the peer posts its irecv
received = dist.irecv(got, left)
busy = (mine * 2).sum()                        # compute between the call and the wait (overlaps the message)
sent.wait()
received.wait()
back = torch.empty(2, 3, device="tpu").t()     # a non-contiguous target, the other way round, its own tag
theirs = torch.arange(6.0, device="tpu").reshape(3, 2) + rank
pending = [dist.irecv(back, right, tag=7), dist.isend(theirs, left, tag=7)]
for work in reversed(pending):
    work.wait()
if rank == 0:
    dist.send(torch.ones(2, device="tpu"), 1)  # blocking send/recv still pair up as before
elif rank == 1:
    dist.recv(torch.empty(2, device="tpu"), 0)
dist.barrier()                                 # rank 2 made fewer sends/recvs: messages are not the group's calls
print("RECEIVED", json.dumps([got.cpu().tolist(), back.cpu().tolist(), float(busy)]))
