import time

import torch
import torch.distributed as dist

dist.init_process_group("tpusim")
x = torch.ones(4, device="tpu")
print("ready", flush=True)
while True:
    dist.all_reduce(x)
    time.sleep(0.01)
