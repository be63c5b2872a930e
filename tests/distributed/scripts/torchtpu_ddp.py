"""A training script written for Google's TorchTPU, run unchanged by tpusim (tests/distributed/test_torchtpu_launch.py).

    torchrun --nproc_per_node 2 torchtpu_ddp.py [BACKEND]        # plain torchrun, no tpusim run
    python -m tpusim run torchtpu_ddp.py --topology 2d:2x1        # priced on a simulated slice

Written as TorchTPU's examples are: ``import torch_tpu``, the device from ``torch_tpu.api.tpu_device()``,
modes from ``torch_tpu._internal.execution_mode`` (tpusim's torch_tpu package). DDP on the "tpu_dist" c10d
backend (or the name given), three steps each in another eager mode through ``em.set_eager_mode``, then
``torch.compile(model)`` with no backend and the compile-cache telemetry ``torch.tpu._get_cache_stats()``.
Rank 0 prints one ``RESULT {json}`` line: the global mean loss per step, the
final parameters, the compiled model's predictions and the cache figures.
"""

import json
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import torch_tpu  # noqa: F401  (TorchTPU's scripts begin so)
from torch_tpu import api
from torch_tpu._internal import execution_mode as em

STEPS = 3
BATCH = 4          # samples per rank and step


def data(world: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(STEPS, BATCH * world, 8, generator=g), torch.randn(STEPS, BATCH * world, 1, generator=g)


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def main() -> None:
    backend = sys.argv[1] if len(sys.argv) > 1 else "tpu_dist"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = api.tpu_device()
    net = model().to(device)
    ddp = DDP(net)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    xs, ys = data(world)
    modes = [em.EagerMode.DEFER_NEVER, em.EagerMode.DEFER_AND_FUSE, em.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING]
    losses, seen = [], []
    for step in range(STEPS):
        with em.set_eager_mode(modes[step]):
            seen.append(torch.tpu.eager_mode.name)
            x = xs[step, rank * BATCH:(rank + 1) * BATCH].to(device)
            y = ys[step, rank * BATCH:(rank + 1) * BATCH].to(device)
            loss = ((ddp(x) - y) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item() / world)
    compiled = torch.compile(net)                 # no backend: "tpu" for tpu inputs, as TorchTPU does
    eager = torch.tpu._get_cache_stats()          # the training loop's eager ops counted so far
    with torch.no_grad():
        pred = compiled(xs[0, :BATCH].to(device))
        pred = compiled(xs[1, :BATCH].to(device))  # same shapes: a cache hit
    stats = torch.tpu._get_cache_stats()
    if rank == 0:
        print("RESULT " + json.dumps({
            "backend": dist.get_backend(), "world": world, "modes": seen, "losses": losses,
            "params": [p.detach().cpu().flatten().tolist() for p in net.parameters()],
            "pred": pred.cpu().flatten().tolist(), "device": torch.tpu.get_device_name(),
            "eager_requests": eager.num_cache_reqs,
            "cache": {"requests": stats.num_cache_reqs - eager.num_cache_reqs,
                      "hits": stats.num_cache_hits - eager.num_cache_hits,
                      "entries": len(stats.per_entry_stats) - len(eager.per_entry_stats)}}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
