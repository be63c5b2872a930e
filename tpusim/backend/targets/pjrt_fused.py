"""Fused eager on the PJRT target: the clusters of tpusim.eager.fusion, each run as one jitted XLA program.

Why the same windows: the simulator prices Fused eager by cutting the op stream into windows
(tpusim/eager/fusion.py); on the PJRT target those windows really compile and run. Where a window ends
is decided by the same ``tpusim.eager.windows.WindowCutter`` the simulator's fused mode drives (this
window feeds it every op and event, in ``Stats.cutter``), and whether an op joins a window by the same
rule (``tpusim.eager.windows.defers``: TorchTPU defers every op but a host read),
so a program recorded while it runs here is priced with the windows that ran:
``pjrt.stats().windows``/``.cuts`` equal ``fuse(trace.records, chip).stats.windows``/``.cuts``
(tests/pjrt/test_pjrt_windows.py).

**Cuts** (``Stats.cuts`` keys, ``tpusim.eager.windows.CUTS``). Fusion's names, for the same events:

- ``sync``: the host reads a value (``.item()``, ``.cpu()``, print: the shim's native hook); a host->device
  copy fills a fresh buffer and a device->device copy is a deferred op (a member, run by the shim at once):
  neither cuts unless it touched pending work (``host``);
- ``opaque``: an op TorchTPU does not defer (a host read). It runs alone, at once;
- ``collective``: a collective of the tpusim c10d backend;
- ``program``: a torch.compile'd graph (tpusim/backend/torch_compile/jax_backend.py) runs;
- ``step``: ``optimizer.step()`` returned;
- ``backward``: ``torch.autograd.backward`` (``Tensor.backward``) returned (tpusim/backend/program_trace/recorder.py's
  ``add_backward_listener``): TorchTPU's autograd post-backward materialization;
- TorchTPU's heuristics (``tpusim.eager.windows``): ``stale``, ``dynamic``, ``random``, ``repeated`` (a value with two
  consumers is an output of its cluster, not a cut: ``fanout``, ``reexecution`` are counted in
  ``cutter.materialized``) (``split`` too, though torch.tpu.ops' kernels run on the host here). The cutter sees each
  op as ``op_node`` builds it (its name and input shapes, the storages it reads and writes, the user's
  line from tpusim/backend/plumbing/source.py), as ``tpusim.eager.fusion.op_node`` does from the op's record; a
  host op's fresh results join the graph once it ran (``WindowCutter.wrote``);
- ``size``: an op arrives while the window holds ``tpusim.eager.windows.MAX_CLUSTER_OPS`` ops;
- ``mode``: the eager mode changed (pending work runs as it was recorded);
- ``end``: ``pjrt.flush()`` or ``pjrt.disable()`` (for fusion: the end of the trace).

And the few only this target needs (``OWN_CUTS``, described in ``CUTS``; fusion prices an ideal
device that needs none of them): ``alias``, ``host``, ``resize``. Two of fusion's cuts have no
counterpart here: ``tpusim.backend.step()`` (a ``step``) and ``torch.tpu.synchronize()`` (a
``sync``) only add a record while recording, with no hook this target can use; neither needs a
flush (every host read cuts anyway), so a program calling them ends fewer windows here. The
shim's native events reach both the window (first) and the recorder (tpusim/backend/plumbing/native_hooks.py), so
recording while fused sees every event too.

**Members.** The cutter counts the ops fusion would put in a window. Ops that cannot be traced into the
program (random draws on the host generator, hand-written kernels, ops without lowering, views;
an out= or self that must change shape or dtype, except an empty out=: ``grow``) run at once outside it,
out of order, which is safe because they touch no pending value (else they cut: ``host``,
``resize``); they still count as members, so the window's size and the windows counted are
fusion's. An op that cuts for a reason of this target's own (``alias``, ``host``, ``resize``)
opens the next window, as it would have joined the old one.

**Values** are keyed by their host view: (storage address, offset, shape, strides, dtype). A
storage holds at most one pending value: a write under another view replaces it when it covers
the same bytes (a reshape or permutation of them), else cuts (``alias``). A read of another view
of it is derived inside the program (its bytes in memory order, sliced, transposed, broadcast,
else gathered) when the pending value is dense (no gaps), of the same dtype and covers the view.
Inputs are read from host memory when the window runs, before any output lands; then the last
value of each view lands, unless nothing outside the window holds its memory any more (a
temporary that died inside the window: ``_live``), and XLA drops its computation. The window holds
every tensor it reads or writes, so no storage is freed and reused (colliding keys) while ops pend.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax
from torch.optim.optimizer import register_optimizer_step_post_hook

from tpusim.backend.lowering import jax_to_tensor, tensor_to_numpy
from tpusim.backend.lowering.dtypes import jax_dtype, torch_dtype
from tpusim.backend.plumbing import native_hooks, source
from tpusim.backend.plumbing.state import STATE
from tpusim.backend.program_trace import recorder
from tpusim.backend.targets.pjrt_ops import Compiled, OpInfo, Stats, operands, run_now
from tpusim.eager.windows import Node, WindowCutter, defers, node_key

Key = tuple
OWN_CUTS = ("alias", "host", "resize")   # the cuts only this target makes (tpusim.eager.windows.CUTS says why)


# ---------------------------------------------------------------- which ops and events cut (fusion's rules)


def fusible(name: str) -> bool:
    """Whether an op joins a window as fusion's does: TorchTPU defers it (``tpusim.eager.windows.defers``). One
    that is not runs alone (cut ``opaque``)."""
    return defers(name)


DEVICE_COPY = "aten::copy_"      # a device->device copy, as the recorder names its record


def op_node(name: str, reads: list[torch.Tensor], writes: list[torch.Tensor]) -> Node:
    """A fusible op as the window cutter's deferred graph sees it (``tpusim.eager.fusion.op_node`` builds the same
    from the op's record): its hash, the storages it reads and writes, the user's line issuing it."""
    return Node(key=node_key(name, tuple((tuple(t.shape), str(t.dtype)) for t in reads)),
                reads=tuple(t.untyped_storage().data_ptr() for t in reads),
                writes=tuple(t.untyped_storage().data_ptr() for t in writes), name=name,
                source=source.user_source(), results=tuple(tuple(t.shape) for t in writes))


# ---------------------------------------------------------------- views of pending values


def _key(t: torch.Tensor) -> Key:
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)


def _uses(t: torch.Tensor) -> int:
    return torch._C._storage_Use_Count(t.untyped_storage()._cdata)


def _memory_order(shape: tuple, strides: tuple) -> tuple[int, ...] | None:
    """The dims of a dense layout (a permutation of a contiguous block) from outermost to innermost in
    memory, or None when the layout has gaps or overlaps."""
    order = sorted(range(len(shape)), key=lambda d: (shape[d] == 1, -strides[d]))
    expected = 1
    for d in reversed(order):
        if shape[d] != 1 and strides[d] != expected:
            return None
        expected *= shape[d]
    return tuple(order)


def view_spec(base: Key, view: Key) -> tuple | None:
    """How to read ``view`` from the pending value under ``base`` (same storage): (the base's memory
    order, offset into it, shape, strides), or None when the program cannot (see the module docstring)."""
    order = _memory_order(base[2], base[3])
    if order is None or view[4] != base[4] or any(s < 0 for s in view[3]):
        return None
    delta = view[1] - base[1]
    last = delta + sum((size - 1) * stride for size, stride in zip(view[2], view[3]))
    if math.prod(view[2]) and (delta < 0 or last >= math.prod(base[2])):
        return None
    return (order, delta, view[2], view[3])


def overwrites(base: Key, view: Key) -> bool:
    """A write of ``view`` replaces every byte of the pending value under ``base`` (a reshape or a
    permutation of the same block): the window keeps the new value only."""
    return view[1] == base[1] and view[4] == base[4] and math.prod(view[2]) == math.prod(base[2]) and \
        _memory_order(view[2], view[3]) is not None and _memory_order(base[2], base[3]) is not None


def derive(value: object, spec: tuple) -> object:
    """The view ``spec`` of a pending jax value: a slice of its bytes in memory order, transposed and
    broadcast; a gather where the view is not a permuted dense block."""
    base_order, delta, shape, strides = spec
    if not math.prod(shape):
        return jnp.zeros(shape, value.dtype)
    flat = value.transpose(base_order).reshape(-1)
    kept = [d for d in range(len(shape)) if strides[d] != 0 and shape[d] != 1]
    order = sorted(kept, key=lambda d: -strides[d])
    dense = all(strides[d] == math.prod(shape[e] for e in order[i + 1:]) for i, d in enumerate(order))
    if dense:
        block = lax.slice(flat, (delta,), (delta + math.prod(shape[d] for d in kept),))
        block = block.reshape([shape[d] for d in order]).transpose([order.index(d) for d in kept])
    else:
        grids = np.meshgrid(*[np.arange(shape[d]) * strides[d] for d in kept], indexing="ij")
        block = flat[delta + sum(grids, np.zeros((), np.int64))]
    kept_shape = [shape[d] if d in kept else 1 for d in range(len(shape))]
    return jnp.broadcast_to(block.reshape(kept_shape), shape)


def grow(out: torch.Tensor, shape: tuple) -> None:
    """Resize an empty out= (a host alias of device memory) in device memory: composite ops such as
    ``abs`` hand the fallback ``abs.out`` with ``empty(0)``. The device storage grows in place (the
    shim's resize_) and the alias follows it, so the fallback's sync_back finds the same memory and
    the value can wait in the window (a host-side resize would be copied to fresh device memory at
    once)."""
    shim = STATE.shim
    device = shim.to_device([out], shim.current_device())[0]
    device.resize_(shape)
    out.set_(shim.host_alias(device))


# ---------------------------------------------------------------- the window


class Window:
    """Pending ops of one fused window and their wiring; ``cut`` runs them as one jitted program."""

    def __init__(self, stats: Stats) -> None:
        self.stats = stats                                    # counts, and the cutter (Stats.cutter)
        self.cache: dict[tuple, Callable] = {}                 # window signature -> jitted program
        self._described: dict[tuple, tuple] = {}              # op signature -> (output shapes, fusible)
        self._specs: dict[tuple, tuple | None] = {}
        self._host_name = ""                                  # the host op host_fusible was last asked about
        self._step_hook = None
        self._clear()

    @property
    def cutter(self) -> WindowCutter:
        """Where windows end and how many ops the pending one holds (fusion's count: tpusim/eager/windows.py)."""
        return self.stats.cutter

    def _clear(self) -> None:
        self.ops: list[tuple] = []                    # (fn, input refs, #outputs, first value, multi)
        self.inputs: list[torch.Tensor] = []          # host tensors read when the window runs
        self.scalars: list[float] = []                # lifted floats, passed after the inputs
        self.input_keys: dict[Key, int] = {}
        self.read_storages: set[int] = set()
        self.values: dict[Key, int] = {}              # key -> produced value index (latest write)
        self.value_dst: dict[int, torch.Tensor] = {}  # value index -> host tensor it lands in
        self.pending: dict[int, Key] = {}             # storage address -> the key of its pending value
        self.fresh: dict[int, int] = {}               # value index -> storage use count when nothing else held it
        self.n_values = 0

    # ------------------------------------------------------------ hooks

    def install(self) -> None:
        native_hooks.add(self._native, first=True)
        self._step_hook = register_optimizer_step_post_hook(lambda optimizer, args, kwargs: self.cut("step"))
        recorder.add_backward_listener(self._after_backward)

    def uninstall(self) -> None:
        native_hooks.remove(self._native)
        recorder.remove_backward_listener(self._after_backward)
        if self._step_hook is not None:
            self._step_hook.remove()
            self._step_hook = None

    def _after_backward(self) -> None:
        """TorchTPU's autograd post-backward materialization."""
        self.cut("backward")

    def _native(self, kind: str, a: torch.Tensor, b: torch.Tensor | None) -> None:
        """The shim's native item/copy: item notifies before reading, copy after copying. A host read cuts
        (``sync``), and a copy that raced pending work is redone once the window has run. A device->device
        copy is a deferred op, as fusion's ``copy_`` record: a member, and where it reads a pending value or
        writes memory the window uses, it waits in the program (its bytes land when the window runs). A
        host->device copy fills a fresh buffer: no cut, unless it wrote memory the window uses (``host``)."""
        if kind == "copy" and b is not None and b.device.type == "tpu" and a.device.type == "tpu":
            src, dst = STATE.shim.host_alias(a), STATE.shim.host_alias(b)
            if self._touches([src], [dst]):
                self._append(DEVICE_COPY, _copy_fn(tuple(dst.shape), jax_dtype(dst.dtype)), [src], [], [dst],
                             [jax.ShapeDtypeStruct(tuple(dst.shape), jax_dtype(dst.dtype))], False)
            else:
                self._admit(op_node(DEVICE_COPY, [src], [dst]))
            return
        raced = bool(self.ops)
        if kind == "copy" and b is not None and b.device.type == "tpu":
            if not self._touches([], [b]):
                return
            self.cut("host")
        elif self.cutter.size:
            self.cut("sync")
        if raced and kind == "copy" and b is not None:
            src = STATE.shim.host_alias(a) if a.device.type == "tpu" else a
            dst = STATE.shim.host_alias(b) if b.device.type == "tpu" else b
            dst.copy_(src)

    # ------------------------------------------------------------ deciding

    def _describe(self, fn: Compiled, name: str, tensors: list[torch.Tensor], scalars: list[float],
                  args: tuple) -> tuple:
        """(output shapes, fusible) of one op signature, computed once (lifted floats do not change them)."""
        sig = (id(fn), name, tuple((tuple(t.shape), t.dtype) for t in tensors))
        found = self._described.get(sig)
        if found is None:
            specs = [jax.ShapeDtypeStruct(tuple(t.shape), jax_dtype(t.dtype)) for t in tensors]
            shapes = jax.eval_shape(fn, *specs, *scalars)
            found = self._described[sig] = (shapes, fusible(name))
        return found

    def host_fusible(self, name: str) -> bool:
        """``fusible`` of an op the host runs (remembered as the host op asked about last)."""
        self._host_name = name
        return fusible(name)

    def _spec(self, base: Key, key: Key) -> tuple | None:
        pair = (base, key)
        if pair not in self._specs:
            self._specs[pair] = view_spec(base, key)
        return self._specs[pair]

    def _unreadable(self, key: Key) -> bool:
        base = self.pending.get(key[0])
        return base is not None and base != key and self._spec(base, key) is None

    def _unwritable(self, key: Key) -> bool:
        base = self.pending.get(key[0])
        return base is not None and base != key and not overwrites(base, key)

    def _touches(self, reads: list[torch.Tensor], writes: list[torch.Tensor]) -> bool:
        """An op run now would read a pending value or write memory the window reads or writes."""
        if not self.pending and not self.read_storages:
            return False
        storage = [t.untyped_storage().data_ptr() for t in (*reads, *writes)]
        return any(s in self.pending for s in storage) or \
            any(s in self.read_storages for s in storage[len(reads):])

    # ------------------------------------------------------------ counting ops in (the cutter)

    def _admit(self, node: Node) -> None:
        """Count one op in as fusion does; a cut the cutter makes before it runs the pending program."""
        if self.cutter.admit(node) is not None:
            self._run_pending()

    def _cut_before(self, reason: str, node: Node) -> None:
        """End the window before the op just admitted (a cause of this target's own); the op opens
        the next window, as it would have joined the old one."""
        self.cut(reason)
        self.cutter.join(node)

    # ------------------------------------------------------------ recording ops

    def alone(self, run: Callable[[], object], name: str | None = None) -> object:
        """Run an op TorchTPU does not defer now, alone, as fusion does: the pending window ends first
        (``opaque``). ``name``: the host op asked about last."""
        self._admit(Node(key=None, fusible=False, name=self._host_name if name is None else name))
        return run()

    def outside(self, reason: str, reads: list[torch.Tensor], writes: list[torch.Tensor],
                run: Callable[[], object], name: str | None = None) -> object:
        """Run a fusible op now, outside the program: it counts as a member either way; only if it
        touches pending work, that work runs first (cut ``reason``)."""
        node = op_node(self._host_name if name is None else name, reads, writes)
        self._admit(node)
        if self._touches(reads, writes):
            self._cut_before(reason, node)
        result = run()
        made = [t for t in (result if isinstance(result, (tuple, list)) else [result])
                if isinstance(t, torch.Tensor) and not any(t is w for w in writes)]
        self.cutter.wrote(node, [t.untyped_storage().data_ptr() for t in made])   # fresh results join the graph
        return result

    def add(self, name: str, info: OpInfo, fn: Compiled, args: tuple, kwargs: dict, outs: dict) -> object:
        """Append one lowered op (its outputs get host memory now and bytes when the window runs)."""
        inputs = operands(fn, args, kwargs)
        tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
        scalars = inputs[len(tensors):]
        shapes, joins = self._describe(fn, name, tensors, scalars, args)
        if not joins:
            return self.alone(lambda: run_now(info, fn, args, kwargs, outs, self.stats), name)
        multi = isinstance(shapes, (tuple, list))
        leaves = list(shapes) if multi else [shapes]
        targets = _targets(info, args, outs, leaves)
        why = _outside_reason(info, targets, leaves)
        if why is not None:
            return self.outside(why, tensors, targets or [], lambda: run_now(info, fn, args, kwargs, outs, self.stats),
                                name)
        targets = self._append(name, fn, tensors, scalars, targets, leaves, multi)
        if info.kind == "inplace":
            return targets[0]
        if info.kind == "out":
            return targets[0] if len(targets) == 1 else tuple(targets)
        return tuple(targets) if multi else targets[0]

    def _append(self, name: str, fn: Compiled, tensors: list[torch.Tensor], scalars: list[float],
                targets: list[torch.Tensor] | None, leaves: list, multi: bool) -> list[torch.Tensor]:
        """Wire one op into the window; ``targets`` None: fresh host tensors for its outputs (returned)."""
        fresh = targets is None
        if fresh:
            targets = [torch.empty(tuple(s.shape), dtype=torch_dtype(s.dtype)) for s in leaves]
        node = op_node(name, tensors, targets)
        self._admit(node)
        read_keys = [_key(t) for t in tensors]
        write_keys = [] if fresh else [_key(t) for t in targets]
        if any(self._unreadable(k) for k in read_keys) or any(self._unwritable(k) for k in write_keys):
            self._cut_before("alias", node)
        refs = tuple(self._ref(t, k) for t, k in zip(tensors, read_keys)) + tuple(self._scalar(x) for x in scalars)
        if fresh:
            write_keys = [_key(t) for t in targets]
        first = self.n_values
        for t, k in zip(targets, write_keys):
            v = self._produce(t, k)
            if fresh:
                self.fresh[v] = _uses(t)
        self.ops.append((fn, refs, len(targets), first, multi))
        self.stats.ops += 1
        return targets

    def _ref(self, t: torch.Tensor, key: Key) -> tuple:
        v = self.values.get(key)
        if v is not None:
            return ("v", v)
        base = self.pending.get(key[0])
        if base is not None:
            return ("d", self.values[base], self._spec(base, key))
        i = self.input_keys.get(key)
        if i is None:
            i = self.input_keys[key] = len(self.inputs)
            self.inputs.append(t)
            self.read_storages.add(key[0])
        return ("i", i)

    def _scalar(self, value: float) -> tuple:
        """A lifted float: an argument of the program, so its value is not part of the signature."""
        self.scalars.append(value)
        return ("s", len(self.scalars) - 1)

    def _produce(self, dst: torch.Tensor, key: Key) -> int:
        replaced = self.pending.get(key[0])
        if replaced is not None and replaced != key:      # overwritten whole: only the new value lands
            del self.values[replaced]
        v = self.n_values
        self.n_values += 1
        self.values[key] = v
        self.value_dst[v] = dst
        self.pending[key[0]] = key
        return v

    # ------------------------------------------------------------ running

    def cut(self, reason: str) -> None:
        """End the window (``reason``: a ``tpusim.eager.windows.CUTS`` key) and run its program; the cutter
        counts it when it held ops."""
        self.cutter.boundary(reason)
        self._run_pending()

    def _run_pending(self) -> None:
        if self.ops:
            self._run()

    def _live(self) -> list[int]:
        """The values that land in memory: the last write of each view, unless nobody holds that memory
        any more (its device tensors died inside the window): XLA then drops their computation."""
        last = set(self.values.values())
        dead = {v for v in last if v in self.fresh and _uses(self.value_dst[v]) <= self.fresh[v]}
        written = [v for v in last if v not in self.fresh and self.value_dst[v].dim() > 0]
        return sorted(last - dead - self._unreferenced(written))

    def _unreferenced(self, values: list[int]) -> set[int]:
        """Values written into out=/in-place tensors whose device storage only the window still holds:
        its references are one per host alias it keeps (inputs, targets) and the device views made here.
        (Only tensors with dims: the fallback refuses CPU ones there, so these are all aliases.)"""
        if not values:
            return set()
        devices = STATE.shim.to_device([self.value_dst[v] for v in values], STATE.shim.current_device())
        aliases = [*self.inputs, *(t for v, t in self.value_dst.items() if v not in self.fresh)]
        storages = {s._cdata: s for s in (t.untyped_storage() for t in aliases)}
        held = Counter(s.data_ptr() for s in storages.values())
        held.update(d.untyped_storage().data_ptr() for d in devices)
        # _uses counts its own temporary storage object too
        return {v for v, d in zip(values, devices) if _uses(d) - 1 == held[d.untyped_storage().data_ptr()]}

    def _run(self) -> None:
        ops, inputs, scalars = self.ops, self.inputs, self.scalars
        live = self._live()
        dsts = [self.value_dst[v] for v in live]
        sig = (tuple((id(fn), refs, n, first, multi) for fn, refs, n, first, multi in ops),
               tuple((tuple(t.shape), t.dtype) for t in inputs), tuple(live))
        self._clear()
        program = self.cache.get(sig)
        if program is None:
            program = self.cache[sig] = jax.jit(_program(ops, live, len(inputs)))
            self.stats.compiles += 1
        outs = jax.block_until_ready(program(*[tensor_to_numpy(t) for t in inputs], *scalars))
        for dst, value in zip(dsts, outs):
            dst.copy_(jax_to_tensor(value))
        self.stats.executions += 1


_COPIES: dict[tuple, Callable] = {}


def _copy_fn(shape: tuple[int, ...], dtype: object) -> Callable:
    """A device copy's computation into a tensor of ``shape`` and ``dtype`` (copy_ casts and broadcasts), one
    function per target so a window's signature repeats."""
    key = (shape, dtype)
    if key not in _COPIES:
        _COPIES[key] = lambda x: jnp.broadcast_to(jnp.asarray(x).astype(dtype), shape)
    return _COPIES[key]


def _targets(info: OpInfo, args: tuple, outs: dict, leaves: list) -> list[torch.Tensor] | None:
    """The tensors an op writes (self, or its out= tensors; None: fresh outputs); an empty out= is
    grown in device memory first (``grow``)."""
    if info.kind == "inplace":
        return [args[0]]
    if info.kind != "out":
        return None
    dsts = list(outs.values())
    for d, s in zip(dsts, leaves):
        if hasattr(s, "shape") and d.numel() == 0 and tuple(d.shape) != tuple(s.shape) and \
                d.dtype == torch_dtype(s.dtype):
            grow(d, tuple(s.shape))
    return dsts


def _outside_reason(info: OpInfo, targets: list[torch.Tensor] | None, leaves: list) -> str | None:
    """Why an op must run at once, outside the program: a non-tensor result (``host``) or a target
    that must change shape or dtype (``resize``); None when it can wait in the window."""
    if any(s is None or not hasattr(s, "shape") for s in leaves):
        return "host"
    if targets is not None and any(tuple(t.shape) != tuple(s.shape) or t.dtype != torch_dtype(s.dtype)
                                   for t, s in zip(targets, leaves)):
        return "resize"
    return None


def _program(ops: list, live: list[int], n_inputs: int) -> Callable:
    """The window as one function of its inputs (then its lifted floats), returning its live values."""

    def run(*inputs: object) -> list:
        values: dict[int, object] = {}
        for fn, refs, n_out, first, multi in ops:
            args = [inputs[ref[1]] if ref[0] == "i" else values[ref[1]] if ref[0] == "v" else
                    inputs[n_inputs + ref[1]] if ref[0] == "s" else derive(values[ref[1]], ref[2]) for ref in refs]
            out = fn(*args)
            outs = list(out) if multi else [out]
            for j in range(n_out):
                values[first + j] = outs[j]
        return [values[v] for v in live]

    return run
