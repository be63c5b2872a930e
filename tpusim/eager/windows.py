"""Where a Fused eager cluster ends: TorchTPU's deferred graph and its cut heuristics, in one cutter.

Why one module: Fused eager defers ops into a graph of pending values and, at a cut, runs the
pending work as one compiled cluster (fused kernels inside). The simulator's fused mode
(``tpusim.eager.fusion.fuse``) prices those clusters and the PJRT target
(``tpusim/backend/targets/pjrt_fused.py``) really compiles them; both feed their events to a
``WindowCutter``, so the clusters they make are the same by construction.

The algorithm is TorchTPU's Fused Eager (``csrc/eager/`` of google-pytorch/torch_tpu, read in the
public copy jonathan1920/torch_tpu; ../shared/research/torchtpu.md). **Every op TorchTPU implements is
deferred** (``op_dispatcher``: each dispatched op becomes a ``DeferredOp`` in the stream's events queue,
gathers, scatters, sorts, copies, fills and index ops included); only a host read runs outside the graph
(``HOST_READ_OPS``, ``defers``). Pending work is **materialized** (the cluster ends, every pending node
runs: TorchTPU's safe materialization) at:

- host reads: ``.item()``, ``.cpu()``, print, ``synchronize`` (``sync``, ``d2h``); distributed ops
  (``collective``: TorchTPU splits the graph before and after a collective unless
  ``TORCH_TPU_INTERNAL_MATERIALIZE_COLLECTIVE_TENSORS`` is ``0``/``false``, ``materialize_collectives``;
  then the collective is a node of the graph); compiled-graph executions (``program``); autograd's
  post-backward (``backward``: ``backward()`` returned, a mark tpusim/backend/recorder.py records and the PJRT
  target hears); the end of a training step, a change of eager mode, the end of the program.

A host->device copy is not one: TorchTPU copies the bytes into a fresh, materialized buffer
(``CopyCpuToTpu``) and pending work goes on. The **heuristics**, checked as each op arrives (``admit``),
are each one row of ``CUTS``:

- ``stale``: the op overwrites a pending buffer that pending ops already read: the old value would
  be a buffer no live tensor refers to any more, so the cluster holding it runs first;
- ``dynamic``: an op whose output shape depends on data (``DYNAMIC_SHAPE_OPS``): TorchTPU computes its
  output size in the pending graph and reads it back (``nonzero.cc``: ``.cpu().item()``), so the cluster
  ends before the op, which then opens the next cluster with the size known;
- ``split``: a node marked as a split point (``FORCED_SPLIT_OPS``: TorchTPU's own Pallas kernels,
  ``torch.tpu.ops``, ``OpSplitMode::kSplitBoth``) is a cluster by itself;
- ``random``: a random draw (``RANDOM_OPS``) takes and updates the generator's state, so TorchTPU splits
  the graph after it (``OpSplitMode::kSplitAfter``); it ends its cluster;
- ``repeated``: the last ops repeat the ``REPEAT_MIN``-``REPEAT_MAX`` ops before them (one layer of a
  model): the cluster ends after the repeat, so every later layer compiles to the same cluster and
  hits the compile cache (``TORCH_TPU_INTERNAL_DETECT_REPEATED_OPS``: ``safe``, the default, or
  ``aggressive`` detect; anything else turns the rule off). TorchTPU's ``OpWindow``: a history of
  ``2 x REPEAT_MAX`` op hashes, the last repeat length tried first, the next search ``length`` ops
  later; only deferred ops are entries, and a ``_foreach_`` op's per-tensor records
  (consecutive records of one op from one line) are one entry, as the one dispatch they are on
  TorchTPU. The history is kept across the heuristics' own cuts (so layer after layer is found) and
  starts afresh at a user-visible materialization (``HARD_CUTS``: a sync, a dynamic shape's size read
  back, a step, backward, a collective...): a repeat spanning one is the step repeating, whose clusters
  those cuts already align, and cutting it again would split every step at an arbitrary op (mid-optimizer). TorchTPU
  keeps its history (it has no step cut; its loss.item() then falls at that arbitrary op).

**Split graph** (``splits_graph``): a materialization compiles its cluster as one executable only in
``MaterializationMode::kFullGraph``, which TorchTPU uses for a repeat cut under ``aggressive`` alone; every
other materialization (``safe``'s repeat cuts, syncs, backward, ...) is ``kSplitGraph`` (materialize.h's
default): the cluster runs as one executable per *materialization point*, in program order
(split_utils.cc, ``materialization_chunks``): every value the cluster must output (one a live tensor
still holds, or a later cluster reads) ends an executable, and so does a value read past the next such
point.

**Materialized, not cut** (``MATERIALIZED``, counted in ``materialized``): TorchTPU makes every
pending value that is still referred to an *output* of the executable computing it (events_queue.cc
``GetOpUsage``: a live, non-stale buffer is ``kOutput``), so its value is written to HBM once and a
later consumer, in this cluster or a later one, reads it instead of recomputing it. The cluster goes
on. ``fanout`` (a second consumer of a pending value) and ``reexecution`` (a value an earlier cluster
computed, read again) are such values: the research note's "materialized" means this, not a cut.
In tpusim a value that leaves its fused kernel is written to HBM by fusion's byte rule already
(``tpusim.eager.fusion``: read outside its kernel or alive at the cluster's end), and the trace's values
from earlier clusters are in HBM; the cutter only counts them. A deferred op whose results nobody holds
when its cluster runs is dropped (no weak reference left to it in the queue, events_queue.cc; fusion
drops it), unless it has side effects (a collective).

Ops that are not deferred (``Node.fusible`` False: a host read) end the cluster and run alone
(``opaque``); ``size`` is tpusim's own guard (``MAX_CLUSTER_OPS``) bounding fusion's grouping pass.

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

from tpusim.trace.ops import base_name

# tpusim's guard, not TorchTPU's: a cluster with no cut for this many ops ends (the grouping pass
# of tpusim.eager.fusion is quadratic in a cluster). TorchTPU has no such bound; the heuristics above
# end clusters long before it in the programs we price (a long chain with no repeat, no sync).
MAX_CLUSTER_OPS = 2048
# Repeated subsequences: lengths detected. TorchTPU's constant is kMaxRepeatedSubsequenceLength =
# 128 with a history of twice that; its minimum (kMinRepeatedSubsequenceLength = 2, strictly
# exceeded) is raised to 10 here, as the research note gives it, so a layer's sub-blocks (the three
# q/k/v projections) are not taken for layers.
REPEAT_MIN = 10
REPEAT_MAX = 128
REPEAT_ENV = "TORCH_TPU_INTERNAL_DETECT_REPEATED_OPS"
REPEAT_MODES = ("safe", "aggressive")      # detect (TorchTPU: split graph / full graph); else off
# TorchTPU's switch for collectives in fused graphs (process_group_tpu.cc: on by default, "0"/"false" turn it off)
COLLECTIVE_ENV = "TORCH_TPU_INTERNAL_MATERIALIZE_COLLECTIVE_TENSORS"
COLLECTIVE_ENV_OFF = ("0", "false")
FANOUT_LIMIT = 2                           # consumers of a pending value that materialize it
# HostRecord(event="dispatch", reason=BACKWARD_REASON, seconds=0): backward() returned (tpusim/backend/recorder.py)
BACKWARD_REASON = "autograd_backward"
# HostRecord(event="dispatch", reason=LAUNCH_REASON, seconds=0): torch_tpu's synchronize(wait=False) launched the
# pending work without waiting for it (tpusim/backend/torchtpu/sync.py)
LAUNCH_REASON = "launch_pending"

# Ops that read a value on the host: the only ops TorchTPU does not defer. Adding one = one name here
# (tpusim.trace.ops.base_name form).
HOST_READ_OPS = frozenset({"_local_scalar_dense", "equal"})
# Ops whose output shape depends on data. Adding one = one name here.
DYNAMIC_SHAPE_OPS = frozenset({
    "nonzero", "masked_select", "unique", "_unique2", "unique_consecutive", "unique_dim", "argwhere",
    "repeat_interleave",
})
# Random draws TorchTPU splits the graph after (OpSplitMode::kSplitAfter in their kernels: random_, uniform_,
# normal, multinomial; torch.rand/randn/randint are an empty tensor and one of them). Adding one = one name here.
RANDOM_OPS = frozenset({"random", "uniform", "normal", "multinomial"})
# Namespaces of ops marked as split points (each a cluster of its own). Adding one = one entry.
FORCED_SPLIT_OPS = ("tpu::",)

# Why a cluster ends. Adding a cut reason = one row here.
CUTS: dict[str, str] = {
    "sync": "the host reads a value (.item(), .cpu(), print, synchronize): pending work materializes",
    "launch": "torch_tpu's synchronize(wait=False): pending work is launched and the host goes on without waiting",
    "d2h": "a device->host copy",
    "opaque": "an op that runs outside the deferred graph (a host read; on the PJRT target an op it cannot "
              "trace): it runs alone",
    "collective": "a distributed op: pending work materializes, the network prices it as its own kernel "
                  f"(unless {COLLECTIVE_ENV}=0)",
    "program": "a torch.compile'd graph runs: it is a cluster of its own",
    "step": "a training step ended (optimizer.step())",
    "mode": "the eager mode changed: what was recorded runs as it was",
    "backward": "autograd's backward() returned (TorchTPU's post-backward materialization): the "
                "gradients are materialized",
    "stale": "an op overwrites a pending buffer other pending ops read: the old value would be stale",
    "split": "an op marked as a split point (torch.tpu.ops' own kernels) is a cluster of its own",
    "dynamic": "an op with a data-dependent output shape: its size is read back first, so the cluster ends "
               "before it and it opens the next one",
    "random": "a random draw updates the generator's state: the graph is split after it",
    "repeated": f"the last ops repeat the {REPEAT_MIN}-{REPEAT_MAX} before them (a layer): one cluster "
                "serves every repeat",
    "size": f"the cluster holds {MAX_CLUSTER_OPS} ops (tpusim's guard on the grouping pass)",
    "end": "the program (or the PJRT target's flush) ended",
    # only the PJRT target, which runs on host memory, needs these three
    "alias": "an op writes a storage holding a pending value under another view, or reads a view of it "
             "the program cannot derive (another dtype, bytes outside the pending value)",
    "host": "an op that runs outside the window (host generator, hand-written kernel, no lowering, "
            "a non-tensor result, a copy) reads or writes a pending value",
    "resize": "an op whose out= or self must change shape (other than an empty out=) reads or writes a "
              "pending value: it runs at once",
}

# Cuts that a user's program makes (not the heuristics): the repeat detector's history starts afresh at
# each. Adding one = one name here.
HARD_CUTS = frozenset({"sync", "launch", "d2h", "dynamic", "collective", "program", "step", "mode", "backward", "end"})

# Why a pending value becomes an output of its cluster (written to HBM) without ending it. Adding a
# reason = one row here.
MATERIALIZED: dict[str, str] = {
    "fanout": f"an op is consumer number {FANOUT_LIMIT} of a pending value: the value is an output of the "
              "cluster (written once), not recomputed for each consumer",
    "reexecution": "an op reads a value an earlier cluster computed: it was that cluster's output (in HBM), "
                   "so it is read, not computed again",
}


@dataclass(frozen=True)
class Node:
    """One eager op (or, with collectives kept in fused graphs, one collective) as the deferred graph sees it."""

    key: Hashable                       # what it computes (op and input shapes): the repeat detector's hash
    reads: tuple[Hashable, ...] = ()    # buffers it reads (storage ids; any hashable names, one per buffer)
    writes: tuple[Hashable, ...] = ()   # buffers it writes
    fusible: bool = True                # deferred into the pending graph (``defers``); False: ends it, runs alone
    name: str = ""                      # the op's name ("aten::nonzero"): dynamic shapes, forced splits
    source: str = ""                    # the user's line that issued it: a loop iteration runs it again
    results: tuple = ()                 # its output shapes: with key and source, what an iteration repeats

    @property
    def dynamic(self) -> bool:
        return base_name(self.name) in DYNAMIC_SHAPE_OPS

    @property
    def split(self) -> bool:
        return self.name.startswith(FORCED_SPLIT_OPS)

    @property
    def random(self) -> bool:
        return base_name(self.name) in RANDOM_OPS


def defers(name: str) -> bool:
    """Whether TorchTPU defers the op ``name`` into the pending graph: every op it implements (any op with a
    StableHLO lowering: gathers, scatters, sorts, copies, fills, index ops) except a host read."""
    return base_name(name) not in HOST_READ_OPS


def materialize_collectives() -> bool:
    """Whether a collective materializes pending work (TorchTPU's default) or joins the fused graph
    (``TORCH_TPU_INTERNAL_MATERIALIZE_COLLECTIVE_TENSORS=0``)."""
    return os.environ.get(COLLECTIVE_ENV, "1").strip().lower() not in COLLECTIVE_ENV_OFF


def splits_graph(cut: str) -> bool:
    """Whether the cluster a ``cut`` ended runs as one executable per materialization point (TorchTPU's
    ``kSplitGraph``, every materialization's default) or whole (``kFullGraph``: a repeat cut under
    ``aggressive``)."""
    return not (cut == "repeated" and os.environ.get(REPEAT_ENV, "safe") == "aggressive")


def materialization_chunks(outputs: list[bool], last_read: list[int]) -> list[list[int]]:
    """A cluster's ops (0..n-1, program order) as the executables ``kSplitGraph`` runs (split_utils.cc): op i ends
    one when it makes a value the cluster must output (``outputs[i]``), or when a value it makes is read at a
    position (``last_read[i]``, in the same numbering) past the next op that ends one, so its reader's executable
    can read it. Ops after the last such point make nothing anyone reads: none run."""
    points = set()
    nearest: int | None = None                  # the earliest point after the op walked
    for i in range(len(outputs) - 1, -1, -1):
        if outputs[i] or (nearest is not None and last_read[i] > nearest):
            points.add(i)
            nearest = i
    chunks, chunk = [], []
    for i in range(len(outputs)):
        chunk.append(i)
        if i in points:
            chunks.append(chunk)
            chunk = []
    return chunks


def node_key(name: str, shapes: tuple) -> tuple:
    """The repeat detector's hash of an op: its name without overload and its inputs' shapes and dtypes
    (both feeders build it the same way, so both see the same repeats)."""
    return (base_name(name), shapes)


class RepeatDetector:
    """TorchTPU's ``OpWindow`` (repeated_ops_heuristic.cc): does the op just appended end a suffix
    that repeats the ops right before it?"""

    def __init__(self, low: int = REPEAT_MIN, high: int = REPEAT_MAX) -> None:
        self.low, self.high = low, high
        self.ids: dict[Hashable, int] = {}
        self.reset()

    def reset(self) -> None:
        """Forget the history (TorchTPU's ``OpWindow::Reset``; here at each ``HARD_CUTS`` cut)."""
        self.history: list[int] = []          # op hashes, the last 2 x high
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
        self.materialized: Counter[str] = Counter()     # values made cluster outputs (MATERIALIZED keys)
        self.repeats = RepeatDetector() if (repeat_detection() if repeats is None else repeats) else None
        self._after: str | None = None  # a cut decided after the last op (repeated, split, random)
        self._last: tuple[str, str] = ("", "")     # the last deferred op's name and line (``_dispatch``)
        self._readers: dict[Hashable, int] = {}    # pending buffer -> its pending consumers
        self._earlier: set[Hashable] = set()       # buffers an ended cluster wrote (its outputs)

    def admit(self, node: Node) -> str | None:
        """An eager op arrives. Returns the reason to end the pending cluster before it, or None; a
        deferred op then joins the (new) cluster, one that is not runs alone."""
        reason = self._before(node)
        if reason is not None:
            self.boundary(reason)
        if not node.fusible:
            self._earlier.update(node.writes)
            return reason
        repeated = self.repeats is not None and self._dispatch(node) and self.repeats.append(node.key)
        self.join(node)
        after = "split" if node.split else "random" if node.random else "repeated" if repeated else None
        if after is not None:
            self._after = after
        return reason

    def _before(self, node: Node) -> str | None:
        if self._after is not None and self.size:
            return self._after
        if not node.fusible:
            return "opaque"
        if node.split and self.size:
            return "split"
        if node.dynamic and self.size:
            return "dynamic"
        if any(self._readers.get(w, 0) for w in node.writes):
            return "stale"
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

    def join(self, node: Node) -> None:
        """Add a fusible op to the pending cluster without any check (the PJRT target's own cuts
        reopen a cluster with the op that caused them). A pending value it is the second consumer of
        (fanout) or an earlier cluster's output it reads (reexecution) is counted as materialized."""
        for r in set(node.reads):
            if r in self._readers:
                self._readers[r] += 1
                if self._readers[r] == FANOUT_LIMIT:
                    self.materialized["fanout"] += 1
            elif r in self._earlier:
                self._earlier.discard(r)        # counted once per value
                self.materialized["reexecution"] += 1
        self._wrote(node.writes)
        self.size += 1

    def _wrote(self, buffers: tuple | list) -> None:
        for w in buffers:
            self._readers[w] = 0
            self._earlier.discard(w)

    def wrote(self, node: Node, buffers: list[Hashable]) -> None:
        """``node``, already admitted, also wrote ``buffers`` (results known only once it ran: the PJRT
        target's host ops); nothing when the node ran alone or the cluster is empty."""
        if self.size and node.fusible:
            self._wrote(buffers)

    def boundary(self, reason: str) -> str:
        """End the pending cluster for ``reason`` (a key of ``CUTS``); counted when it held ops. A cut
        decided after the last op (a repeat, a split point) is what ended it: that reason is returned.
        Its values are outputs from now on (``reexecution``); a ``HARD_CUTS`` cut resets the repeat
        detector."""
        if reason not in CUTS:
            raise ValueError(f"unknown window cut {reason!r}; accepted: {', '.join(CUTS)}")
        ended = self._after or reason
        if self.size:
            self.windows += 1
            self.cuts[ended] += 1
        if reason in HARD_CUTS and self.repeats is not None:
            self.repeats.reset()
            self._last = ("", "")
        self.size = 0
        self._after = None
        self._earlier.update(self._readers)
        self._readers.clear()
        return ended
