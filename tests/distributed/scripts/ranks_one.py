"""--ranks one numerics rule, checked collective by collective (rank 0 of 8)."""

import json
import os

import torch
import torch.distributed as dist

os.environ.update(TPUSIM_RANKS="one", RANK="0", WORLD_SIZE="8")
import tpusim.backend as tb  # noqa: E402
import tpusim.backend.distributed  # noqa: E402,F401

out = {}
with tb.recording() as rec:
    dist.init_process_group()                       # no backend: "tpusim" for tpu; no rendezvous needed
    n = dist.get_world_size()
    x = torch.arange(4.0, device="tpu")
    a = x.clone(); dist.all_reduce(a); out["sum"] = a.tolist()                     # noqa: E702
    a = x.clone(); dist.all_reduce(a, op=dist.ReduceOp.AVG); out["avg"] = a.tolist()  # noqa: E702
    a = x.clone(); dist.all_reduce(a, op=dist.ReduceOp.MAX); out["max"] = a.tolist()  # noqa: E702
    g = torch.empty(n * 4, device="tpu"); dist.all_gather_into_tensor(g, x); out["gather"] = g.tolist()  # noqa: E702
    big = torch.arange(float(n * 2), device="tpu")
    r = torch.empty(2, device="tpu"); dist.reduce_scatter_tensor(r, big); out["rs"] = r.tolist()  # noqa: E702
    t = torch.empty(n * 2, device="tpu"); dist.all_to_all_single(t, big); out["a2a"] = t.tolist()  # noqa: E702
    b = x.clone(); dist.broadcast(b, src=3); out["bcast"] = b.tolist()  # noqa: E702
    dist.barrier()
    group = dist.new_group([0, 1, 2, 3])
    a = x.clone(); dist.all_reduce(a, group=group); out["sub"] = a.tolist()  # noqa: E702
out["records"] = [(c.collective, c.bytes, list(c.group)) for c in rec.trace.records if c.kind == "collective"]
out["meta"] = rec.trace.meta.to_dict().get("ranks_one", {})
print("RESULT " + json.dumps(out))
