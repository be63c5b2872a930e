"""isend/irecv under ``--ranks all``: a message completes when both sides have posted it, not at the call.

c10d's ``dist.send``/``dist.recv`` are ``isend``/``irecv`` followed by ``wait()``, and
``batch_isend_irecv`` calls ``isend``/``irecv`` in turn (the tpusim group does not coalesce), so every
send and recv of the tpusim process group is a message here:

1. at the call it is fingerprinted (hang.py ``Control.publish``: the n-th send from rank a to rank b
   with a tag in a group meets the n-th recv at b from a with that tag there), and a send's tensor is
   copied: what leaves, whenever the peer posts, is what the caller passed;
2. it is posted to gloo only once the other side's fingerprint is there and agrees (a gloo message of
   the wrong size has no clean error), at whichever comes first on this rank: the call itself, a
   ``wait()``, or the wait loop of any collective or barrier (``Control.tick``); with both sides posted
   gloo moves the data, and a thread per message waits on gloo's work (gloo's send and recv works
   only complete inside their ``wait()``, so they cannot be polled);
3. it completes at its ``wait()`` (``Control.block``: a send nobody receives is diagnosed there), which
   fills a recv's tensor from the staging buffer gloo wrote; messages never waited for are waited at
   ``destroy_process_group()`` (``drain``) or, without it, at the rank's normal exit (``drain()``,
   worker.py), so a message is never dropped silently.

So the ring that pipeline parallelism and ring attention post each step (every rank isends to the next,
irecvs from the previous, then waits both) completes, and a real deadlock is still reported, once a
rank blocks.

Under ``--ranks one`` (no peers run) a recv follows the symmetry rule instead (``mirrored``, numerics.Mirror):
it gets what this rank itself sent in the matching exchange, filled at its ``wait()`` as above.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.futures import Future

from tpusim.backend.distributed import numerics
from tpusim.backend.distributed.hang import Call, Control
from tpusim.backend.distributed.transport import Gloo
from tpusim.backend.plumbing.source import user_source

_CALLER_DEPTH = 8          # frames looked through for c10d's isend/irecv (our method, its caller, ...)


def blocking_call() -> bool:
    """Whether c10d's blocking ``dist.send``/``dist.recv`` made this call: they are isend/irecv plus
    wait(), indistinguishable at the process group except by who called isend/irecv."""
    frame = sys._getframe(1)
    for _ in range(_CALLER_DEPTH):
        if frame is None:
            return False
        code = frame.f_code
        if code.co_name in ("isend", "irecv") and code.co_filename == c10d.__file__:
            caller = frame.f_back
            return (caller is not None and caller.f_code.co_name in ("send", "recv")
                    and caller.f_code.co_filename == c10d.__file__)
        frame = frame.f_back
    return False


@dataclass(eq=False)
class Message:
    """One side of one message: its fingerprint, the gloo buffer, and where a recv's data goes."""

    call: Call
    gloo: Gloo | None            # None in shape-only mode (TPUSIM_NUMERICS=off): matched, nothing moves
    peer: int                    # the other side's rank in the group (gloo's numbering)
    buffer: torch.Tensor | None  # send: the copy taken at the call; recv: the staging buffer gloo fills
    target: torch.Tensor | None = None   # recv: the caller's tensor's host alias, filled at wait()
    work: dist.Work | None = None        # gloo's, once posted
    posted: bool = False
    finished: bool = False
    arrived: threading.Event = field(default_factory=threading.Event)   # gloo's work waited
    error: Exception | None = None       # what gloo's wait raised (a peer gone mid-message)

    def moved(self) -> bool:
        return self.posted and (self.work is None or self.arrived.is_set())

    def post(self) -> None:
        """Hand the buffer to gloo; a thread waits on its work (wait() releases the GIL)."""
        self.posted = True
        if self.gloo is not None and self.buffer is not None:
            post = self.gloo.post_send if self.call.kind == "send" else self.gloo.post_recv
            try:
                self.work = post(self.buffer, self.peer, self.call.tag)
            except RuntimeError as e:     # the peer's process is gone already: said at this message's wait()
                self.error = e
                self.arrived.set()
                return
            threading.Thread(target=self._await_gloo, name="tpusim-p2p", daemon=True).start()

    def _await_gloo(self) -> None:
        try:
            self.work.wait()
        except Exception as e:      # noqa: BLE001 (handed to the rank's own wait())
            self.error = e
        finally:
            self.arrived.set()


class Outbox:
    """This rank's messages not yet waited, in the order they were called."""

    def __init__(self, control: Control) -> None:
        self.control = control
        self.open: list[Message] = []
        self.works: dict[int, MessageWork] = {}    # keeps each Work's Python object alive until waited
        control.tick = self.progress

    def add(self, message: Message) -> MessageWork:
        message.call = self.control.publish(message.call)
        self.open.append(message)
        work = MessageWork(self, message)
        self.works[id(message)] = work
        self.progress()
        return work

    def progress(self) -> None:
        """Post every message whose other side has been called (in call order, so a channel's
        messages reach gloo in order: the peer publishes them in order too)."""
        for m in self.open:
            if not m.posted and self.control.counterpart(m.call) is not None:
                m.post()

    def wait(self, message: Message) -> None:
        if message.finished:
            return
        self.control.block(message.call, message.moved)
        if message.error is not None:      # a peer gone mid-message: say which and why, not gloo's words
            call = message.call
            raise self.control.fail(self.control.peer_gone(call) or f"tpusim: rank {call.rank}'s {call.describe()} "
                                    f"({call.where()}) failed in transport: {message.error}")
        if message.target is not None and message.buffer is not None:
            message.target.copy_(message.buffer)
        message.finished = True
        self.open.remove(message)
        self.works.pop(id(message), None)

    def drain(self, group_name: str | None) -> None:
        """Wait for every open message of group ``group_name`` (its shutdown: destroy_process_group), or of every
        group (None: the rank's exit), so a message never waited for still moves, and one whose peer never comes
        is diagnosed here."""
        for m in [m for m in self.open if group_name is None or m.call.group_name == group_name]:
            self.wait(m)


class MessageWork(dist.Work):
    """The Work isend/irecv return: wait() blocks until the message has moved (recv: tensor filled)."""

    def __init__(self, outbox: Outbox, message: Message) -> None:
        super().__init__()
        self.outbox, self.message = outbox, message

    def wait(self, timeout: object = None) -> bool:
        self.outbox.wait(self.message)
        return True

    def is_completed(self) -> bool:
        """Whether wait() would return at once (moves posted messages on first; never blocks)."""
        self.outbox.progress()
        return self.message.finished or self.message.moved()

    def is_success(self) -> bool:
        return self.is_completed()

    def get_future(self) -> Future:
        """A future already done: it waits for the message first (so it can block, as wait() does)."""
        self.wait()
        return _finished([self.message.target] if self.message.target is not None else [])


def _finished(result: list[torch.Tensor]) -> Future:
    """A future already done with ``result`` (a Work's get_future() once its wait() has returned)."""
    fut: Future = Future()
    fut.set_result(result)
    return fut


_OUTBOX: Outbox | None = None


def drain(group_name: str | None = None) -> None:
    """Finish the open messages of a process group being shut down, or (None) every open message of this
    process: a rank's normal exit, the script ended without waiting for them or calling
    destroy_process_group(). One whose peer never posts is diagnosed as at any wait(); nothing to do, and
    nothing contacted, when no message was sent."""
    if _OUTBOX is not None:
        _OUTBOX.drain(group_name)


def outbox(control: Control) -> Outbox:
    """This process's outbox (one for every group: a wait in any group moves them all)."""
    global _OUTBOX
    if _OUTBOX is None or _OUTBOX.control is not control:
        _OUTBOX = Outbox(control)
    return _OUTBOX


def message(control: Control, kind: str, tensor: torch.Tensor, host: torch.Tensor, me: int, peer: int,
            group_peer: int, tag: int, gloo: Gloo | None, group_name: str, *, nonblocking: bool) -> MessageWork:
    """Call one send or recv (``kind``) of ``tensor`` (``host``: its host alias) between global ranks ``me``
    and ``peer`` in process group ``group_name``; returns its Work. ``gloo`` None: only matched (shape-only
    mode)."""
    dtype = str(tensor.dtype).removeprefix("torch.")
    call = Call(kind, (tuple(tensor.shape),), dtype, "", -1, user_source(), tuple(sorted((me, peer))), group_name, 0,
                me, peer, int(tag), nonblocking)
    if gloo is None:
        return outbox(control).add(Message(call, None, group_peer, None))
    if kind == "send":
        return outbox(control).add(Message(call, gloo, group_peer, host.clone(memory_format=torch.contiguous_format)))
    staging = torch.empty(host.shape, dtype=host.dtype)
    return outbox(control).add(Message(call, gloo, group_peer, staging, target=host))


# -- --ranks one: the symmetry rule ------------------------------------------------------------------------------

class MirroredRecv(dist.Work):
    """A ``--ranks one`` recv's Work: its tensor is filled by the rule at the first wait() (as a real recv is
    filled when it completes), so a matching send this rank makes after the irecv (a ring in the other
    order) still counts."""

    def __init__(self, mirror: numerics.Mirror, channel: tuple, number: int, target: torch.Tensor) -> None:
        super().__init__()
        self.mirror, self.channel, self.number, self.target = mirror, channel, number, target
        self.filled = False

    def wait(self, timeout: object = None) -> bool:
        if not self.filled:
            self.mirror.fill(self.channel, self.number, self.target)
            self.filled = True
        return True

    def is_completed(self) -> bool:
        return self.wait()

    def is_success(self) -> bool:
        return self.wait()

    def get_future(self) -> Future:
        self.wait()
        return _finished([self.target])


def mirrored(mirror: numerics.Mirror, kind: str, host: torch.Tensor, channel: tuple) -> dist.Work | None:
    """``--ranks one``: a send (``host``: its tensor's host alias) is kept in the group's ``mirror`` for the
    recv that mirrors it (None returned: it is complete); a recv returns the Work that fills ``host`` at
    wait(). ``channel``: (offset to the peer in the group's ranks modulo its size: the peer is ahead for a
    send, behind for a recv; tag)."""
    if kind == "send":
        mirror.send(channel, host)
        return None
    return MirroredRecv(mirror, channel, mirror.recv(channel), host)
