"""``--ranks all``: tensors really move between the rank processes, over gloo on loopback.

Every op works on zero-copy host aliases of the tpu tensors (``shim.host_alias``), so gloo reads
and writes the device memory itself. Gloo lacks AVG and PREMUL_SUM and a tensor reduce-scatter;
they are built from SUM all-reduces here, so results are exact (float sums in gloo's order).
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d


def _wait(work: object) -> None:
    work.wait()


class Gloo:
    """One gloo communicator per tpusim process group (same ranks, its own store prefix)."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: timedelta) -> None:
        self.rank, self.size = rank, size
        self.pg = dist.ProcessGroupGloo(dist.PrefixStore("gloo/", store), rank, size, timeout)

    # -- reductions --------------------------------------------------------------------------------
    def all_reduce(self, tensors: list[torch.Tensor], op: str, factor: float = 1.0) -> None:
        opts = c10d.AllreduceOptions()
        opts.reduceOp = _gloo_op(op)
        if op == "premul_sum":
            for t in tensors:
                t.mul_(factor)
        _wait(self.pg.allreduce(tensors, opts))
        if op == "avg":
            for t in tensors:
                t.div_(self.size)

    def reduce(self, tensor: torch.Tensor, root: int, op: str, factor: float = 1.0) -> None:
        keep = tensor.clone() if self.rank != root else None
        self.all_reduce([tensor], op, factor)
        if keep is not None:
            tensor.copy_(keep)

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op: str, factor: float = 1.0) -> None:
        full = inp.reshape(self.size, *out.shape).clone()
        self.all_reduce([full], op, factor)
        out.copy_(full[self.rank])

    # -- data movement -----------------------------------------------------------------------------
    def broadcast(self, tensors: list[torch.Tensor], root: int) -> None:
        opts = c10d.BroadcastOptions()
        opts.rootRank = root
        _wait(self.pg.broadcast(tensors, opts))

    def all_gather(self, outs: list[torch.Tensor], inp: torch.Tensor) -> None:
        staging = [torch.empty_like(inp) for _ in outs]
        _wait(self.pg.allgather([staging], [inp.contiguous()], c10d.AllgatherOptions()))
        for o, s in zip(outs, staging):
            o.copy_(s)

    def all_to_all(self, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int], in_splits: list[int]) -> None:
        staging = torch.empty_like(out)
        _wait(self.pg.alltoall_base(staging, inp.contiguous(), list(out_splits), list(in_splits),
                                    c10d.AllToAllOptions()))
        out.copy_(staging)

    def gather(self, outs: list[torch.Tensor], inp: torch.Tensor, root: int) -> None:
        opts = c10d.GatherOptions()
        opts.rootRank = root
        staging = [torch.empty_like(inp) for _ in outs] if self.rank == root else []
        _wait(self.pg.gather([staging] if staging else [], [inp.contiguous()], opts))
        for o, s in zip(outs, staging):
            o.copy_(s)

    def scatter(self, out: torch.Tensor, ins: list[torch.Tensor], root: int) -> None:
        opts = c10d.ScatterOptions()
        opts.rootRank = root
        staging = torch.empty_like(out)
        _wait(self.pg.scatter([staging], [[t.contiguous() for t in ins]] if self.rank == root else [], opts))
        out.copy_(staging)

    # -- point to point: posted, not waited (p2p.py waits; gloo moves the data once both sides posted) --
    def post_send(self, tensor: torch.Tensor, dst: int, tag: int) -> dist.Work:
        """Post ``tensor`` (contiguous, kept alive by the caller until the work completes) to group rank ``dst``."""
        return self.pg.send([tensor], dst, tag)

    def post_recv(self, tensor: torch.Tensor, src: int, tag: int) -> dist.Work:
        """Post a receive into ``tensor`` (contiguous) from group rank ``src``."""
        return self.pg.recv([tensor], src, tag)

    def barrier(self) -> None:
        _wait(self.pg.barrier(c10d.BarrierOptions()))


def _gloo_op(op: str) -> dist.ReduceOp:
    table = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.SUM, "premul_sum": dist.ReduceOp.SUM,
             "product": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX,
             "band": dist.ReduceOp.BAND, "bor": dist.ReduceOp.BOR, "bxor": dist.ReduceOp.BXOR}
    return table[op]
