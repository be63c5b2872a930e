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
send / recv        send: nothing; recv from rank r-d: what this rank itself sent to rank r+d
                   (same tag, the k-th recv gets the k-th send), else zeros (Mirror)
barrier            nothing
=================  =====================================================================

Exact when the data really is replicated (DDP with the same batch on every rank, broadcast,
the all-reduce of replicated values). Not reference-correct when ranks hold different data:
gathers of shards (FSDP parameters, tensor-parallel activations), reduce-scatters and
all-reduces of per-rank gradients, all-to-alls and receives (exact in a ring of equal tensors).
``SHARD_DEPENDENT`` lists the kinds whose results are never reference-correct unless every shard is
equal; the report names them.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

SHARD_DEPENDENT = ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter", "recv")
DATA_DEPENDENT = ("all_reduce", "reduce")   # exact only if every rank's input is the same
RECV_WHY = ("exact only if the sender holds what this rank sent in the matching exchange (it is this rank's own "
            "send, as in a ring; zeros when it made none)")

RULE = ("--ranks one: this process is rank 0 of the whole world and every peer is assumed to hold the "
        "same tensor as rank 0 (all_reduce sum = n*x, avg = x; all_gather = rank 0's shard in every "
        "slot; reduce_scatter = n * rank 0's own chunk; all_to_all = rank 0's chunk for itself in "
        "every slot; recv from rank s = what rank 0 itself sent to rank n-s, its matching send in a ring, else "
        "zeros). Values that depend on other ranks' data are "
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


class Mirror:
    """The rule for point-to-point messages: rank r's k-th recv from rank r-d with tag t is the translate
    (by -d) of rank r+d's k-th recv from r, so under the rule it gets what rank r sent in its k-th send to
    rank r+d with tag t (offsets modulo the group size). A ring (each rank sends to the next, receives from
    the previous) is thereby exact when every rank sends the same tensor. A recv whose matching send has
    another shape or dtype, or was never made, gets zeros: a definite value, never uninitialised memory.

    Sends are copied at the call (what leaves is what the caller passed); at most ``KEEP`` copies wait per
    channel for their recv, older ones are dropped (their recv gets zeros), so a rank that only sends (the
    first pipeline stage) does not accumulate them."""

    KEEP = 8

    def __init__(self) -> None:
        self._sent: dict[tuple, OrderedDict[int, torch.Tensor]] = {}   # channel -> send number -> copy
        self._count: dict[tuple[str, tuple], int] = {}                  # (side, channel) -> calls so far

    def _next(self, side: str, channel: tuple) -> int:
        n = self._count.get((side, channel), 0)
        self._count[(side, channel)] = n + 1
        return n

    def send(self, channel: tuple, host: torch.Tensor) -> None:
        """Keep a copy of the k-th send on ``channel`` (offset to the peer, tag)."""
        kept = self._sent.setdefault(channel, OrderedDict())
        kept[self._next("send", channel)] = host.clone(memory_format=torch.contiguous_format)
        while len(kept) > self.KEEP:
            kept.popitem(last=False)

    def recv(self, channel: tuple) -> int:
        """Number the recv on ``channel``; ``fill`` with that number gives its value."""
        return self._next("recv", channel)

    def fill(self, channel: tuple, number: int, target: torch.Tensor) -> None:
        """target <- the matching send's copy when there is one of its shape and dtype, else zeros."""
        match = self._sent.get(channel, OrderedDict()).pop(number, None)
        if match is not None and match.shape == target.shape and match.dtype == target.dtype:
            target.copy_(match)
        else:
            target.zero_()
