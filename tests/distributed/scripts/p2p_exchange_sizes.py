import torch
import torch.distributed as dist

dist.init_process_group("tpusim")
rank = dist.get_rank()
peer = 1 - rank
mine = torch.ones(4 * (rank + 1), device="tpu")      # the two directions carry different sizes
got = torch.empty(4 * (peer + 1), device="tpu")
for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, mine, peer), dist.P2POp(dist.irecv, got, peer)]):
    w.wait()
print("GOT", got.sum().item())
