"""Where a Fused eager cluster ends: TorchTPU's deferred graph and its cut heuristics, in one cutter.

Why one module: Fused eager defers ops into a graph of pending values and, at a cut, runs the
pending work as one compiled cluster (fused kernels inside). The simulator's fused mode
(``tpusim.fusion.fuse``) prices those clusters and the PJRT target
(``backend/targets/pjrt_fused.py``) really compiles them; both feed their events to a
``WindowCutter``, so the clusters they make are the same by construction.

The algorithm is TorchTPU's Fused Eager (``csrc/eager/`` of google-pytorch/torch_tpu, read in the
public copy jonathan1920/torch_tpu; ../shared/research/torchtpu.md). Pending work is
**materialized** (the cluster ends, every pending node runs: TorchTPU's safe materialization) at:

- host reads: ``.item()``, ``.cpu()``, print, ``synchronize`` (``sync``, ``d2h``), host copies in
  (``h2d``); distributed ops (``collective``); compiled-graph executions (``program``); the end of a
  training step, a change of eager mode, the end of the program;

and by the **heuristics**, checked as each op arrives (``admit``), each one row of ``CUTS``:

- ``stale``: the op overwrites a pending buffer that pending ops already read: the old value would
  be a buffer no live tensor refers to any more, so the cluster holding it runs first;
- ``fanout``: the op is a second consumer of a pending value: the value is materialized (written
  once) instead of being kept live, and on TorchTPU recomputed, by every later consumer;
- ``reexecution``: the op (same op, input and output shapes, source line) is already in the pending history
  of its own input: a loop-carried chain (``h = f(h)`` in a loop, a model's layers in a ``for``)
  would grow the cluster every iteration, so the earlier iteration is materialized and each
  iteration compiles to the same cluster;
- ``dynamic``: an op whose output shape depends on data (``DYNAMIC_SHAPE_OPS``) cannot be traced
  into a static program: the cluster ends and it runs alone;
- ``split``: a node marked as a split point (``FORCED_SPLIT_OPS``: TorchTPU's own Pallas kernels,
  ``torch.tpu.ops``, compiled as executables of their own) is a cluster by itself;
- ``repeated``: the last ops repeat the ``REPEAT_MIN``-``REPEAT_MAX`` ops before them (one layer of a
  model): the cluster ends after the repeat, so every later layer compiles to the same cluster and
  hits the compile cache (``TORCH_TPU_INTERNAL_DETECT_REPEATED_OPS``: ``safe``, the default, or
  ``aggressive`` detect; anything else turns the rule off). TorchTPU's ``OpWindow``: a history of
  ``2 x REPEAT_MAX`` op hashes (kept across materializations), the last repeat length tried first,
  the next search ``length`` ops later; only deferred (fusible) ops are entries, and a ``_foreach_``
  op's per-tensor records (consecutive records of one op from one line) are one entry, as the
  one dispatch they are on TorchTPU. ``safe`` (split graph) and ``aggressive`` (full graph) make the
  same cut here: tpusim's clusters are never split further (fusion groups each into kernels).

Ops that are not fusible (fusion role ``opaque``) end the cluster and run alone (``opaque``), as
before; ``size`` is tpusim's own guard (``MAX_CLUSTER_OPS``) bounding fusion's grouping pass.

Feed the cutter an event, get the reason to end the pending cluster first, or None:
``admit(node)`` for an eager op (``Node``: what it computes, the buffers it reads and writes),
``boundary(reason)`` for anything else. It counts the clusters that held ops and why each ended
(``cuts``); ending an empty cluster counts nothing. Adding a cut reason = one row in ``CUTS``.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass

from tpusim.ops import base_name

# tpusim's guard, not TorchTPU's: a cluster with no cut for this many ops ends (the grouping pass
# of tpusim.fusion is quadratic in a cluster). TorchTPU has no such bound; the heuristics above
# end clusters long before it in the programs we price (a chain with no fanout, no repeat).
MAX_CLUSTER_OPS = 2048
# Repeated subsequences: lengths detected. TorchTPU's constant is kMaxRepeatedSubsequenceLength =
# 128 with a history of twice that; its minimum (kMinRepeatedSubsequenceLength = 2, strictly
# exceeded) is raised to 10 here, as the research note gives it, so a layer's sub-blocks (the three
# q/k/v projections) are not taken for layers.
REPEAT_MIN = 10
REPEAT_MAX = 128
REPEAT_ENV = "TORCH_TPU_INTERNAL_DETECT_REPEATED_OPS"
REPEAT_MODES = ("safe", "aggressive")      # detect (TorchTPU: split graph / full graph); else off
FANOUT_LIMIT = 2                           # consumers of a pending value that materialize it

# Ops whose output shape depends on data. Adding one = one name here (tpusim.ops.base_name form).
DYNAMIC_SHAPE_OPS = frozenset({
    "nonzero", "masked_select", "unique", "_unique2", "unique_consecutive", "unique_dim", "argwhere",
    "repeat_interleave",
})
# Namespaces of ops marked as split points (each a cluster of its own). Adding one = one entry.
FORCED_SPLIT_OPS = ("tpu::",)

# Why a cluster ends. Adding a cut reason = one row here.
CUTS: dict[str, str] = {
    "sync": "the host reads a value (.item(), .cpu(), print, synchronize): pending work materializes",
    "h2d": "a host->device copy",
    "d2h": "a device->host copy",
    "opaque": "an op fusion does not fuse (gathers, fills, device copies, sorts, topk): it runs alone",
    "collective": "a distributed op: pending work materializes, the network prices it as its own kernel",
    "program": "a torch.compile'd graph runs: it is a cluster of its own",
    "step": "a training step ended (optimizer.step())",
    "mode": "the eager mode changed: what was recorded runs as it was",
    "fanout": f"an op is consumer number {FANOUT_LIMIT} of a pending value: the value is materialized, "
              "not kept live (and recomputed) for every consumer",
    "reexecution": "an op (same op, shapes and line) already in the pending history of its input (a "
                   "loop-carried chain): the earlier iteration is materialized so the cluster stops growing",
    "stale": "an op overwrites a pending buffer other pending ops read: the old value would be stale",
    "split": "an op marked as a split point (torch.tpu.ops' own kernels) is a cluster of its own",
    "dynamic": "an op with a data-dependent output shape: it cannot join a static program, it runs alone",
    "repeated": f"the last ops repeat the {REPEAT_MIN}-{REPEAT_MAX} before them (a layer): one cluster "
                "serves every repeat",
    "size": f"the cluster holds {MAX_CLUSTER_OPS} ops (tpusim's guard on the grouping pass)",
    "end": "the program (or the PJRT target's flush) ended",
    # only the PJRT target, which runs on host memory, needs these three
    "alias": "an op writes a storage holding a pending value under another view, or reads a view of it "
             "the program cannot derive (another dtype, bytes outside the pending value)",
    "host": "an op that runs outside the window (host generator, hand-written kernel, no lowering, "
            "a non-tensor result) reads or writes a pending value",
    "resize": "an op whose out= or self must change shape (other than an empty out=) reads or writes a "
              "pending value: it runs at once",
}


@dataclass(frozen=True)
class Node:
    """One eager op as the deferred graph sees it."""

    key: Hashable                       # what it computes (op and input shapes): the repeat detector's hash
    reads: tuple[Hashable, ...] = ()    # buffers it reads (storage ids; any hashable names, one per buffer)
    writes: tuple[Hashable, ...] = ()   # buffers it writes
    fusible: bool = True                # False: ends the cluster and runs alone
    name: str = ""                      # the op's name ("aten::nonzero"): dynamic shapes, forced splits
    source: str = ""                    # the user's line that issued it: a loop iteration runs it again
    results: tuple = ()                 # its output shapes: with key and source, what an iteration repeats

    @property
    def dynamic(self) -> bool:
        return base_name(self.name) in DYNAMIC_SHAPE_OPS

    @property
    def split(self) -> bool:
        return self.name.startswith(FORCED_SPLIT_OPS)


def node_key(name: str, shapes: tuple) -> tuple:
    """The repeat detector's hash of an op: its name without overload and its inputs' shapes and dtypes
    (both feeders build it the same way, so both see the same repeats)."""
    return (base_name(name), shapes)


class RepeatDetector:
    """TorchTPU's ``OpWindow`` (repeated_ops_heuristic.cc): does the op just appended end a suffix
    that repeats the ops right before it?"""

    def __init__(self, low: int = REPEAT_MIN, high: int = REPEAT_MAX) -> None:
        self.low, self.high = low, high
        self.history: list[int] = []          # op hashes, the last 2 x high
        self.ids: dict[Hashable, int] = {}
        self.pos = 0                          # ops appended so far
        self.next_valid = 0                   # no search before this position
        self.last = 0                         # the repeat length found last

    def append(self, key: Hashable) -> bool:
        self.history.append(self.ids.setdefault(key, len(self.ids)))
        if len(self.history) > 4 * self.high:          # trim in batches: 2 x high are kept
            del self.history[:-2 * self.high]
        self.pos += 1
        if self.pos < self.next_valid:
            return False
        h = self.history[-2 * self.high:]
        n = len(h)
        if n < 2 * self.low:
            return False
        if self.last and n >= 2 * self.last and self._match(h, self.last):
            return True
        return any(self._match(h, size) for size in range(self.low, n // 2 + 1))

    def _match(self, h: list[int], size: int) -> bool:
        if h[-size - 1] != h[-1] or h[-2 * size:-size] != h[-size:]:
            return False
        self.next_valid = self.pos + size
        self.last = size
        return True


def repeat_detection() -> bool:
    """Whether the repeated-subsequence rule runs (TorchTPU's variable; default ``safe``)."""
    return os.environ.get(REPEAT_ENV, "safe") in REPEAT_MODES


class WindowCutter:
    """The pending cluster (its deferred graph) and the cuts made so far (see the module docstring)."""

    def __init__(self, limit: int | None = None, repeats: bool | None = None) -> None:
        self.limit = MAX_CLUSTER_OPS if limit is None else limit
        self.size = 0                   # ops in the pending cluster
        self.windows = 0                # clusters that held ops and ended
        self.cuts: Counter[str] = Counter()
        self.repeats = RepeatDetector() if (repeat_detection() if repeats is None else repeats) else None
        self._after: str | None = None  # a cut decided after the last op (repeated, split)
        self._last: tuple[str, str] = ("", "")     # the last deferred op's name and line (``_dispatch``)
        self._readers: dict[Hashable, int] = {}          # pending buffer -> its pending consumers
        self._history: dict[Hashable, frozenset] = {}    # pending buffer -> (op key, line)s it came from

    def admit(self, node: Node) -> str | None:
        """An eager op arrives. Returns the reason to end the pending cluster before it, or None; a
        fusible op then joins the (new) cluster, a non-fusible one runs alone."""
        reason = self._before(node)
        if reason is not None:
            self.boundary(reason)
        if not node.fusible:
            return reason
        repeated = self.repeats is not None and self._dispatch(node) and self.repeats.append(node.key)
        self.join(node)
        if node.split or repeated:
            self._after = "split" if node.split else "repeated"
        return reason

    def _before(self, node: Node) -> str | None:
        if self._after is not None and self.size:
            return self._after
        if not node.fusible:
            return "dynamic" if node.dynamic else "opaque"
        if node.split and self.size:
            return "split"
        if any(self._readers.get(w, 0) for w in node.writes):
            return "stale"
        reads = set(node.reads)
        if any(self._readers.get(r, -1) >= FANOUT_LIMIT - 1 for r in reads):
            return "fanout"
        if any((node.key, node.results, node.source) in self._history.get(r, ()) for r in reads):
            return "reexecution"
        if self.size >= self.limit:
            return "size"
        return None

    def _dispatch(self, node: Node) -> bool:
        """Whether a deferred op is a dispatch of its own for the repeat detector: a ``_foreach_`` op
        (one dispatch on TorchTPU) reaches tpusim as one record per tensor, so consecutive ops of one
        name from one line are one entry of the history."""
        this = (base_name(node.name), node.source)
        new, self._last = this != self._last or not node.name, this
        return new

    def _lineage(self, node: Node) -> frozenset:
        """The ops (key, output shapes, line) a value ``node`` writes was computed from in this cluster."""
        return frozenset({(node.key, node.results, node.source)}).union(
            *(self._history.get(r, ()) for r in set(node.reads)))

    def join(self, node: Node) -> None:
        """Add a fusible op to the pending cluster without any check (the PJRT target's own cuts
        reopen a cluster with the op that caused them)."""
        reads = set(node.reads)
        history = self._lineage(node)
        for r in reads:
            if r in self._readers:
                self._readers[r] += 1
        for w in node.writes:
            self._readers[w] = 0
            self._history[w] = history
        self.size += 1

    def wrote(self, node: Node, buffers: list[Hashable]) -> None:
        """``node``, already admitted, also wrote ``buffers`` (results known only once it ran: the PJRT
        target's host ops); nothing when the node ran alone or the cluster is empty."""
        if self.size and node.fusible:
            history = self._lineage(node)
            for b in buffers:
                self._readers[b] = 0
                self._history[b] = history

    def boundary(self, reason: str) -> str:
        """End the pending cluster for ``reason`` (a key of ``CUTS``); counted when it held ops. A cut
        decided after the last op (a repeat, a split point) is what ended it: that reason is returned."""
        if reason not in CUTS:
            raise ValueError(f"unknown window cut {reason!r}; accepted: {', '.join(CUTS)}")
        ended = self._after or reason
        if self.size:
            self.windows += 1
            self.cuts[ended] += 1
        self.size = 0
        self._after = None
        self._readers.clear()
        self._history.clear()
        return ended
