"""The ``--ranks one`` numerics rule: one process plays rank ``r`` of a world of ``n``.

**Rule: every peer is assumed to hold exactly the tensor this rank holds.** Each collective then
has a definite result, computed locally (in place, on host aliases of the device memory):

=================  =====================================================================
all_reduce         sum: n*x; avg, min, max, band, bor: x; product: x**n; premul_sum: f*n*x
reduce             as all_reduce on the root; other ranks unchanged
broadcast          unchanged (the root's tensor is this rank's)
all_gather         this rank's input in every peer's slot
reduce_scatter     this rank's chunk of its own input, reduced as all_reduce (sum: n*chunk)
all_to_all         this rank's chunk addressed to itself, in every peer's slot
gather / scatter   gather: this rank's input in every slot (on the root); scatter: the root's
                   list entry for this rank when this rank is the root, else unchanged
send / recv        send: nothing; recv: the buffer is left unchanged
barrier            nothing
=================  =====================================================================

Exact when the data really is replicated (DDP with the same batch on every rank, broadcast,
the all-reduce of replicated values). Not reference-correct when ranks hold different data:
gathers of shards (FSDP parameters, tensor-parallel activations), reduce-scatters and
all-reduces of per-rank gradients, all-to-alls and receives. ``SHARD_DEPENDENT`` lists the kinds
whose results are never reference-correct unless every shard is equal; the report names them.
"""

from __future__ import annotations

import torch

SHARD_DEPENDENT = ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter", "recv")
DATA_DEPENDENT = ("all_reduce", "reduce")   # exact only if every rank's input is the same

RULE = ("--ranks one: this process is rank 0 of the whole world and every peer is assumed to hold the "
        "same tensor as rank 0 (all_reduce sum = n*x, avg = x; all_gather = rank 0's shard in every "
        "slot; reduce_scatter = n * rank 0's own chunk; all_to_all = rank 0's chunk for itself in "
        "every slot; recv leaves its buffer unchanged). Values that depend on other ranks' data are "
        "therefore not reference-correct; shapes, dtypes and every priced byte are.")


def reduce_local(x: torch.Tensor, op: str, n: int, factor: float = 1.0) -> None:
    """x <- the reduction of n copies of x, in place."""
    if op == "sum":
        x.mul_(n)
    elif op == "premul_sum":
        x.mul_(factor * n)
    elif op == "product":
        x.pow_(n)
    elif op == "bxor":
        if n % 2 == 0:
            x.zero_()
    # avg, min, max, band, bor: n copies of x reduce to x


def all_gather_into(out: torch.Tensor, inp: torch.Tensor, n: int) -> None:
    out.view(n, *inp.shape).copy_(inp.unsqueeze(0).expand(n, *inp.shape))


def reduce_scatter_into(out: torch.Tensor, inp: torch.Tensor, rank: int, n: int, op: str, factor: float) -> None:
    out.copy_(inp.reshape(n, *out.shape)[rank])
    reduce_local(out, op, n, factor)


def all_to_all_into(out: torch.Tensor, inp: torch.Tensor, rank: int, n: int,
                    out_splits: list[int], in_splits: list[int]) -> None:
    ins = list(inp.split(in_splits)) if in_splits else list(inp.chunk(n))
    outs = list(out.split(out_splits)) if out_splits else list(out.chunk(n))
    mine = ins[rank]
    for slot in outs:
        if slot.shape == mine.shape:
            slot.copy_(mine)
