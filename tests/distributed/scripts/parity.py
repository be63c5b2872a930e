"""--ranks all parity: DDP, FSDP2 and a tensor-parallel DTensor MLP against one-device references, and an
FSDP2 model built on the meta device and initialised on "tpu" against the CPU initialisation of one seed.

Every rank computes the single-device reference itself (same seed, the whole batch), then the
distributed version, and prints "OK <name>" when they match.
"""


import torch
import torch.distributed as dist
from torch import nn

dist.init_process_group("tpusim")
rank, world = dist.get_rank(), dist.get_world_size()


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 8)).to("tpu")


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(world * 4, 8, generator=g).to("tpu"), torch.randn(world * 4, 8, generator=g).to("tpu")


def reference(steps: int) -> nn.Module:
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = batch()
    for _ in range(steps):
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        opt.step()
    return model


def check(name: str, got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.detach().cpu(), w.detach().cpu(), rtol=1e-4, atol=1e-5)
    print(f"OK {name}")


ref = reference(3)

# DDP: each rank takes its slice of the batch; averaged gradients = the full-batch gradient
ddp_model = make_model()
ddp = nn.parallel.DistributedDataParallel(ddp_model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
x, y = batch()
for _ in range(3):
    opt.zero_grad()
    ((ddp(x[rank::world]) - y[rank::world]) ** 2).mean().backward()
    opt.step()
check("ddp", list(ddp_model.parameters()), list(ref.parameters()))

# FSDP2: parameters sharded over every rank, each rank its slice of the batch
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402

mesh = init_device_mesh("tpu", (world,), mesh_dim_names=("fsdp",))
fsdp_model = make_model()
fully_shard(fsdp_model[0], mesh=mesh)
fully_shard(fsdp_model, mesh=mesh)
opt = torch.optim.SGD(fsdp_model.parameters(), lr=0.1)
for _ in range(3):
    opt.zero_grad()
    ((fsdp_model(x[rank::world]) - y[rank::world]) ** 2).mean().backward()
    opt.step()
check("fsdp2", [p.full_tensor() for p in fsdp_model.parameters()], list(ref.parameters()))

# Tensor parallel MLP (DTensor): first layer column-parallel, second row-parallel, the whole batch
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module  # noqa: E402

tp_mesh = init_device_mesh("tpu", (world,), mesh_dim_names=("tp",))
tp_model = parallelize_module(make_model(), tp_mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
opt = torch.optim.SGD(tp_model.parameters(), lr=0.1)
for _ in range(3):
    opt.zero_grad()
    ((tp_model(x) - y) ** 2).mean().backward()
    opt.step()
check("tp", [p.full_tensor() for p in tp_model.parameters()], list(ref.parameters()))

# FSDP2 on the meta device, initialised on tpu (torchtitan's way): the same values as one CPU init of the
# seed, bit for bit (normal_ and kaiming uniform_ draws; 37 rows shard unevenly over 4 ranks)
def meta_net() -> nn.Module:
    return nn.Sequential(nn.Embedding(37, 24), nn.Linear(24, 40), nn.Linear(40, 7))


with torch.device("meta"):
    meta_model = meta_net()
for layer in (*meta_model, meta_model):
    fully_shard(layer, mesh=mesh)
meta_model.to_empty(device="tpu")
torch.manual_seed(1234)
for layer in meta_model:
    layer.reset_parameters()
got = [p.full_tensor().cpu() for p in meta_model.parameters()]
torch.manual_seed(1234)
want = list(meta_net().parameters())
assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True)), "meta init differs from CPU's"
print("OK meta_init")
dist.destroy_process_group()
