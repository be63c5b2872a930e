"""The c10d process group "tpusim": every collective DDP, FSDP2, DTensor and funcol issue, recorded and run.

A Python ``dist.ProcessGroup`` subclass (torch's PyProcessGroup trampoline), created per group by
``dist.init_process_group("tpusim")`` / ``new_group`` / ``init_device_mesh("tpu", ...)``. Per call:

1. ``--ranks all``: fingerprint and compare across the group first (hang.py);
2. record a ``CollectiveRecord`` (kind, this rank's input bytes, the group's global ranks, the
   DeviceMesh dimension when the group is one, reduction, async, the user's source line);
3. compute the result: ``--ranks one`` by the symmetry rule (numerics.py; a recv: this rank's own matching
   send, at its wait()), ``--ranks all`` over gloo (transport.py); nothing in shape-only mode
   (TPUSIM_NUMERICS=off);
4. return an already-completed Work (the simulator, not this process, models overlap); send/recv
   (c10d's isend/irecv) under ``--ranks all`` return a Work that completes when both sides have
   posted the message (p2p.py), so posted rings complete.

Asynchronous in the trace (``async_op``: the simulator runs it on ICI beside later compute, and the first
device op that reads or writes its buffers waits for it) when the caller passed ``async_op=True`` or
issued it on a stream other than the device's default one: FSDP2 runs its parameter all-gathers and
gradient reduce-scatters synchronously on its own streams, asynchronous to the compute stream, which
only waits for them (an event) where it reads the gathered parameters.

Collective -> trace kind: gather and scatter are priced as all_gather (same bytes into/out of
the root); send/recv as ``permute`` on the group (sender, receiver), so the simulator pairs a send with
the recv of the same direction (``--ranks one`` records the send side only), async
(overlapping compute until a device op touches the buffer) when made by isend/irecv or
batch_isend_irecv, synchronous when made by the blocking dist.send/dist.recv.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future
from torch.futures import Future

from tpusim.backend.distributed import emit, numerics, p2p
from tpusim.backend.distributed.hang import Call, Control
from tpusim.backend.distributed.transport import Gloo
from tpusim.backend.plumbing.source import user_source
from tpusim.backend.plumbing.state import STATE
from tpusim.backend.targets import flush_pending
from tpusim.trace.records import InexactCollective, RanksOne

_OPS = ("sum", "avg", "product", "min", "max", "band", "bor", "bxor", "premul_sum")
CONTROL: Control | None = None      # set by the world group in --ranks all
CONTROL_SECRET = ""                 # --ranks all: what signs the control store's values (worker.py sets it)


def ranks_mode(world_size: int) -> str:
    """"one" or "all": TPUSIM_RANKS, else "all" (every process is a real rank, as under torchrun)."""
    mode = os.environ.get("TPUSIM_RANKS", "").strip().lower() or ("all" if world_size > 1 else "one")
    if mode not in ("one", "all"):
        raise ValueError(f"TPUSIM_RANKS={mode!r}; accepted: one, all")
    return mode


def _op(op: object) -> tuple[str, float]:
    for name in _OPS:
        if op == getattr(dist.ReduceOp, name.upper()):
            factor = 1.0
            if name == "premul_sum":
                raw = getattr(op, "factor", 1.0)
                factor = float(raw.item() if isinstance(raw, torch.Tensor) else raw)
            return name, factor
    return "sum", 1.0


def _host(t: torch.Tensor) -> torch.Tensor:
    """The CPU tensor to compute on: a zero-copy alias of a tpu tensor's memory."""
    return STATE.shim.host_alias(t) if t.device.type == "tpu" else t


def _done(result: object) -> dist.Work:
    fut: Future = Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


class _Staged:
    """Host aliases for a call; non-contiguous ones are staged through a contiguous copy."""

    def __init__(self) -> None:
        self.back: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        h = _host(t)
        if h.is_contiguous():
            return h
        c = h.contiguous()
        self.back.append((h, c))
        return c

    def finish(self) -> None:
        for h, c in self.back:
            h.copy_(c)


class TpusimProcessGroup(dist.ProcessGroup):
    """One process group on the simulated slice (see the module docstring)."""

    def __init__(self, opts: object, backend_options: object = None) -> None:
        rank, size = int(opts.group_rank), int(opts.group_size)
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        given = [int(r) for r in opts.global_ranks_in_group]
        self.is_world = not given
        self.global_ranks: tuple[int, ...] = tuple(given) if given else tuple(range(size))
        self._name = str(opts.group_id)
        self._desc = ""
        self.mode = ranks_mode(size if self.is_world else max(self.global_ranks) + 1)
        self.seq = 0
        self.mirror = numerics.Mirror()     # --ranks one: this group's sends, for the recvs that mirror them
        timeout = opts.timeout if isinstance(opts.timeout, timedelta) else timedelta(minutes=30)
        self.gloo: Gloo | None = None
        if self.mode == "all" and size > 1:
            self.gloo = Gloo(opts.store, rank, size, timeout)
        if self.mode == "all" and self.is_world:
            _init_control(opts.store, rank)

    # -- names the c10d machinery asks for ----------------------------------------------------------
    def getBackendName(self) -> str:  # noqa: N802 (c10d's names)
        return "tpusim"

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._name = str(name)

    def getGroupName(self) -> str:  # noqa: N802
        return self._name

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        self._desc = str(desc)

    def getGroupDesc(self) -> str:  # noqa: N802
        return self._desc

    @property
    def mesh_axis(self) -> str:
        return self._desc[5:] if self._desc.startswith("mesh_") else ""

    def __repr__(self) -> str:
        return f"TpusimProcessGroup(rank={self._rank}, ranks={list(self.global_ranks)[:8]}, mode={self.mode})"

    # -- the one path every collective takes --------------------------------------------------------
    def _call(self, kind: str, inputs: list[torch.Tensor], outputs: list[torch.Tensor], result: object,
              one: Callable[[_Staged], None] | None, real: Callable[[_Staged], None] | None, *,
              op: str = "", root: int = -1, async_op: bool = False, nbytes: int | None = None,
              record_kind: str | None = None, record: bool = True, group: tuple[int, ...] | None = None,
              check: bool = True) -> dist.Work:
        flush_pending("collective")             # the PJRT target's pending ops write our inputs
        source = user_source()
        members = self.global_ranks if group is None else group
        if self.mode == "all" and check and self._size > 1 and CONTROL is not None:
            tensors = inputs or outputs
            dtype = str(tensors[0].dtype)[6:] if tensors else ""
            CONTROL.arrive(Call(kind, tuple(tuple(t.shape) for t in inputs), dtype, op, root, source,
                                self.global_ranks, self._name, self.seq, self.global_ranks[self._rank]),
                           self._size)
        if check:                               # the group's collectives, numbered; a send/recv involves two ranks only
            self.seq += 1
        async_op = async_op or _on_side_stream(inputs or outputs)
        if record:
            recorded_group = () if self.is_world and group is None else members
            emit.collective(record_kind or kind, inputs, outputs, recorded_group, mesh_axis=self.mesh_axis,
                            reduce_op=op, async_op=async_op, nbytes=nbytes, source=source)
        if self.mode == "one" and kind in numerics.SHARD_DEPENDENT + numerics.DATA_DEPENDENT:
            _note_inexact(kind, source)
        if STATE.numerics:
            fn = real if self.mode == "all" else one
            if fn is not None and (self.mode == "one" or self.gloo is not None):
                staged = _Staged()
                fn(staged)
                staged.finish()
        return _done(result)

    # -- reductions ---------------------------------------------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts: object = None) -> dist.Work:
        op, factor = _op(opts.reduceOp) if opts is not None else ("sum", 1.0)
        n = self._size
        return self._call("all_reduce", tensors, tensors, tensors,
                          lambda h: [numerics.reduce_local(h(t), op, n, factor) for t in tensors],
                          lambda h: self.gloo.all_reduce([h(t) for t in tensors], op, factor),
                          op=op, async_op=_async(opts))

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: object = None) -> dist.Work:
        return self.allreduce(tensors, opts)

    def reduce(self, tensors: list[torch.Tensor], opts: object) -> dist.Work:
        op, factor = _op(opts.reduceOp)
        root, n = int(opts.rootRank), self._size

        def one(h: _Staged) -> None:
            if self._rank == root:
                for t in tensors:
                    numerics.reduce_local(h(t), op, n, factor)

        return self._call("reduce", tensors, tensors, tensors, one,
                          lambda h: [self.gloo.reduce(h(t), root, op, factor) for t in tensors],
                          op=op, root=root, async_op=_async(opts))

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: object = None) -> dist.Work:
        op, factor = _op(opts.reduceOp) if opts is not None else ("sum", 1.0)
        r, n = self._rank, self._size
        return self._call("reduce_scatter", [input], [output], output,
                          lambda h: numerics.reduce_scatter_into(h(output), h(input), r, n, op, factor),
                          lambda h: self.gloo.reduce_scatter(h(output), h(input), op, factor),
                          op=op, async_op=_async(opts))

    reduce_scatter_single = _reduce_scatter_base

    def reduce_scatter_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: object = None) -> dist.Work:
        op, factor = _op(opts.reduceOp) if opts is not None else ("sum", 1.0)
        r, n = self._rank, self._size
        pairs = list(zip(outputs, inputs))
        return self._call("reduce_scatter", inputs, outputs, outputs,
                          lambda h: [numerics.reduce_scatter_into(h(o), h(i), r, n, op, factor) for o, i in pairs],
                          lambda h: [self.gloo.reduce_scatter(h(o), h(i), op, factor) for o, i in pairs],
                          op=op, async_op=_async(opts))

    def reduce_scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]],
                       opts: object = None) -> dist.Work:
        op, factor = _op(opts.reduceOp) if opts is not None else ("sum", 1.0)
        r, n = self._rank, self._size
        flat_in = [t for chunk in inputs for t in chunk]

        def one(h: _Staged) -> None:
            for o, chunks in zip(outputs, inputs):
                h(o).copy_(h(chunks[r]))
                numerics.reduce_local(h(o), op, n, factor)

        def real(h: _Staged) -> None:
            for o, chunks in zip(outputs, inputs):
                full = torch.stack([h(c) for c in chunks])
                self.gloo.reduce_scatter(h(o), full, op, factor)

        return self._call("reduce_scatter", flat_in, outputs, outputs, one, real, op=op, async_op=_async(opts))

    # -- gathers ------------------------------------------------------------------------------------
    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: object = None) -> dist.Work:
        n = self._size
        return self._call("all_gather", [input], [output], output,
                          lambda h: numerics.all_gather_into(h(output), h(input), n),
                          lambda h: self.gloo.all_gather(list(h(output).view(n, *input.shape)), h(input)),
                          async_op=_async(opts))

    all_gather_single = _allgather_base

    def allgather_into_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: object = None) -> dist.Work:
        n = self._size
        pairs = list(zip(outputs, inputs))
        return self._call("all_gather", inputs, outputs, outputs,
                          lambda h: [numerics.all_gather_into(h(o), h(i), n) for o, i in pairs],
                          lambda h: [self.gloo.all_gather(list(h(o).view(n, *i.shape)), h(i)) for o, i in pairs],
                          async_op=_async(opts))

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                  opts: object = None) -> dist.Work:
        flat_out = [t for outs in outputs for t in outs]

        def one(h: _Staged) -> None:
            for outs, i in zip(outputs, inputs):
                for o in outs:
                    h(o).copy_(h(i))

        def real(h: _Staged) -> None:
            for outs, i in zip(outputs, inputs):
                self.gloo.all_gather([h(o) for o in outs], h(i))

        return self._call("all_gather", inputs, flat_out, outputs, one, real, async_op=_async(opts))

    def allgather_coalesced(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                            opts: object = None) -> dist.Work:
        return self.allgather(outputs, inputs, opts)

    def gather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: object) -> dist.Work:
        root = int(opts.rootRank)
        outs = outputs[0] if outputs else []

        def one(h: _Staged) -> None:
            for o in outs:
                h(o).copy_(h(inputs[0]))

        return self._call("gather", inputs, outs, outputs, one,
                          lambda h: self.gloo.gather([h(o) for o in outs], h(inputs[0]), root),
                          root=root, record_kind="all_gather", async_op=_async(opts))

    def scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: object) -> dist.Work:
        root = int(opts.rootRank)
        ins = inputs[0] if inputs else []

        def one(h: _Staged) -> None:
            if ins:
                h(outputs[0]).copy_(h(ins[self._rank]))

        return self._call("scatter", outputs, outputs, outputs, one,
                          lambda h: self.gloo.scatter(h(outputs[0]), [h(i) for i in ins], root),
                          root=root, record_kind="all_gather", async_op=_async(opts))

    # -- all-to-all ---------------------------------------------------------------------------------
    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                      input_split_sizes: list[int], opts: object = None) -> dist.Work:
        r, n = self._rank, self._size
        outs, ins = list(output_split_sizes), list(input_split_sizes)
        return self._call("all_to_all", [input], [output], output,
                          lambda h: numerics.all_to_all_into(h(output), h(input), r, n, outs, ins),
                          lambda h: self.gloo.all_to_all(h(output), h(input), outs, ins),
                          async_op=_async(opts))

    all_to_all_single = alltoall_base

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: object = None) -> dist.Work:
        r = self._rank

        def one(h: _Staged) -> None:
            for o in outputs:
                h(o).copy_(h(inputs[r]))

        def real(h: _Staged) -> None:
            flat_in = torch.cat([h(i).reshape(-1) for i in inputs])
            flat_out = torch.empty(sum(o.numel() for o in outputs), dtype=flat_in.dtype)
            self.gloo.all_to_all(flat_out, flat_in, [o.numel() for o in outputs], [i.numel() for i in inputs])
            for o, piece in zip(outputs, flat_out.split([o.numel() for o in outputs])):
                h(o).copy_(piece.view(o.shape))

        return self._call("all_to_all", inputs, outputs, outputs, one, real, async_op=_async(opts))

    # -- broadcast, barrier, point-to-point ---------------------------------------------------------
    def broadcast(self, tensors: list[torch.Tensor], opts: object) -> dist.Work:
        root = int(opts.rootRank)
        return self._call("broadcast", tensors, tensors, tensors, None,
                          lambda h: self.gloo.broadcast([h(t) for t in tensors], root),
                          root=root, async_op=_async(opts))

    def barrier(self, opts: object = None) -> dist.Work:
        return self._call("barrier", [], [], None, None, lambda h: self.gloo.barrier(), nbytes=0)

    def shutdown(self) -> None:
        """destroy_process_group: the messages of this group not yet waited for move (or are diagnosed) first."""
        p2p.drain(self._name)

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> dist.Work:
        return self._message("send", tensors, dst, tag)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> dist.Work:
        return self._message("recv", tensors, src, tag)

    def _message(self, kind: str, tensors: list[torch.Tensor], peer: int, tag: int) -> dist.Work:
        """One send or recv (c10d's isend/irecv; dist.send/recv wait on it at once): recorded as a permute on
        the pair, async unless dist.send/recv made it; under ``--ranks all`` a message that completes when
        both sides have posted it (p2p.py)."""
        if len(tensors) != 1:
            raise ValueError(f"tpusim: {kind} takes one tensor (torch.distributed passes one); got {len(tensors)}")
        me, other = self.global_ranks[self._rank], self.global_ranks[peer]
        blocking = p2p.blocking_call()
        inputs, outputs = (tensors, []) if kind == "send" else ([], tensors)
        channel = (me, other) if kind == "send" else (other, me)     # (sender, receiver): the simulator pairs
        self._call(kind, inputs, outputs, tensors, None, None, record_kind="permute",  # each side's n-th on it
                   group=channel, check=False, async_op=not blocking,
                   record=kind == "send" or self.mode == "all",
                   nbytes=sum(t.numel() * t.element_size() for t in tensors))
        if self.mode == "one" and STATE.numerics:      # the symmetry rule: a recv gets this rank's matching send
            offset = (peer - self._rank if kind == "send" else self._rank - peer) % self._size
            work = p2p.mirrored(self.mirror, kind, _host(tensors[0]), (offset, int(tag)))
            return work or _done(tensors)
        if self.mode != "all" or CONTROL is None or self.gloo is None:
            return _done(tensors)
        gloo = self.gloo if STATE.numerics else None
        return p2p.message(CONTROL, kind, tensors[0], _host(tensors[0]), me, other, peer, tag, gloo, self._name,
                           nonblocking=not blocking)


def _async(opts: object) -> bool:
    return bool(getattr(opts, "asyncOp", False))


def _on_side_stream(tensors: list[torch.Tensor]) -> bool:
    """Whether the call is issued on a tpu stream other than the default one (stream id 0) of its
    tensors' device: work there is asynchronous to the compute stream (FSDP2's all-gather and
    reduce-scatter streams)."""
    device = next((t.device for t in tensors if t.device.type == "tpu"), None)
    if device is None:
        return False
    return torch._C._accelerator_getStream(device.index or 0).stream_id != 0


INEXACT: dict[tuple[str, str], int] = {}


def _note_inexact(kind: str, source: str) -> None:
    """Remember a --ranks one collective whose value depends on other ranks' data (for the report)."""
    INEXACT[(kind, source)] = INEXACT.get((kind, source), 0) + 1
    emit.set_meta("ranks_one", RanksOne(numerics.RULE, tuple(InexactCollective(**e) for e in inexact_entries())))


def inexact_entries() -> list[dict]:
    why = {k: "exact only if every rank's shard is equal (it is this rank's shard repeated)"
           for k in numerics.SHARD_DEPENDENT}
    why.update({k: "exact only if every rank's input is the same (replicated data)" for k in numerics.DATA_DEPENDENT})
    why["recv"] = numerics.RECV_WHY
    return [{"kind": k, "source": s, "count": c, "why": why[k]} for (k, s), c in sorted(INEXACT.items())]


def _init_control(store: dist.Store, rank: int) -> None:
    """The world group connects this rank to the control store (the launcher's, else torch's own)."""
    global CONTROL
    address = os.environ.get("TPUSIM_CONTROL", "")
    if address:
        host, port = address.rsplit(":", 1)
        store = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=60))
    CONTROL = Control(store, rank, CONTROL_SECRET)
    CONTROL.set_status("running")
