"""c10d collectives issued asynchronously, recorded shape-only on rank 0 of 64: one with async_op=True
followed by an independent matmul, one read at once, one synchronous, one on a side stream (as FSDP2
issues its all-gathers and reduce-scatters). Writes each case's trace to argv[1]/<case>.jsonl."""

import os
import sys

import torch
import torch.distributed as dist

os.environ.update(TPUSIM_RANKS="one", TPUSIM_NUMERICS="off", RANK="0", WORLD_SIZE="64")
import tpusim.backend as tb  # noqa: E402
import tpusim.backend.distributed  # noqa: E402,F401
from tpusim.trace.records import write_trace  # noqa: E402

N, V = 2048, 2**20           # a 2048^2 bf16 matmul (~37 us on v5p); a 2 MiB bf16 gradient (~21 us all-reduced)
dist.init_process_group()
a = torch.empty(N, N, device="tpu", dtype=torch.bfloat16)
grad = torch.empty(V, device="tpu", dtype=torch.bfloat16)


def case(name: str, body) -> None:
    with tb.recording() as rec:
        body()
    write_trace(rec.trace, os.path.join(sys.argv[1], f"{name}.jsonl"))


def hidden() -> None:
    work = dist.all_reduce(grad, async_op=True)
    _ = a @ a                    # independent of the all-reduce
    work.wait()
    _ = grad * 2                 # reads it


def exposed() -> None:
    dist.all_reduce(grad, async_op=True).wait()
    _ = grad * 2
    _ = a @ a


def synchronous() -> None:
    dist.all_reduce(grad)
    _ = a @ a
    _ = grad * 2


def side_stream() -> None:
    side = torch.tpu.Stream()
    side.wait_stream(torch.tpu.current_stream())
    with torch.tpu.stream(side):
        dist.all_reduce(grad)
    _ = a @ a
    torch.tpu.current_stream().wait_stream(side)
    _ = grad * 2


for name, body in [("hidden", hidden), ("exposed", exposed), ("synchronous", synchronous),
                   ("side_stream", side_stream)]:
    case(name, body)
dist.destroy_process_group()
print("OK")
