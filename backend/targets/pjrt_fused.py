"""Fused mode of the PJRT target: a window of pending ops, executed as one jitted XLA program.

Ops arrive from the executor already lowered (one jax function per op signature). Instead of
running, each is appended to the window: its inputs are wired to values the window produced or
to host memory read at flush time, and its outputs get host memory now (fresh tensors the
fallback adopts as device tensors) and bytes at flush. ``flush`` traces the window into one JAX
function, cached by the window's signature (functions, wiring, input shapes), runs it, and
writes every produced value to its host memory. See pjrt.py for when windows are flushed.

Values are keyed by their host view: (storage address, offset, shape, strides, dtype). A read or
write of a storage that has a pending value under a *different* view flushes first, so aliasing
never reorders. The window holds references to every tensor it reads or writes, so no storage
is freed and reused (which would collide keys) while ops are pending.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Key = tuple


def _key(t: torch.Tensor) -> Key:
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)


def _uses(t: torch.Tensor) -> int:
    return torch._C._storage_Use_Count(t.untyped_storage()._cdata)


class Window:
    def __init__(self, stats: object, limit: int) -> None:
        self.stats = stats
        self.limit = limit
        self.cache: dict[tuple, Callable] = {}
        self._shapes: dict[tuple, object] = {}
        self._clear()

    def _clear(self) -> None:
        self.ops: list[tuple] = []                    # (fn, input refs, #outputs, first value, multi)
        self.inputs: list[torch.Tensor] = []          # host tensors read at flush
        self.input_keys: dict[Key, int] = {}
        self.values: dict[Key, int] = {}              # key -> produced value index (latest write)
        self.value_dst: dict[int, torch.Tensor] = {}  # value index -> host tensor it lands in
        self.storages: dict[int, set[Key]] = {}       # storage address -> keys with pending values
        self.fresh: dict[int, int] = {}              # value index -> storage use count when nothing else held it
        self.n_values = 0

    # ------------------------------------------------------------ hooks

    def install(self) -> None:
        from tpusim.backend.state import STATE

        STATE.shim.set_native_hook(self._native)

    def uninstall(self) -> None:
        from tpusim.backend.state import STATE

        STATE.shim.set_native_hook(None)

    def _native(self, kind: str, a: torch.Tensor, b: torch.Tensor | None) -> None:
        """The shim's native copy/item: item notifies before reading, copy after copying, so a copy
        that raced pending work is redone once the window has run."""
        if not self.ops:
            return
        self.flush(kind)
        if kind == "copy" and b is not None:
            from tpusim.backend.state import STATE

            src = STATE.shim.host_alias(a) if a.device.type == "tpu" else a
            dst = STATE.shim.host_alias(b) if b.device.type == "tpu" else b
            dst.copy_(src)

    # ------------------------------------------------------------ recording

    def _ref(self, t: torch.Tensor) -> tuple[str, int]:
        key = _key(t)
        v = self.values.get(key)
        if v is not None:
            return ("v", v)
        i = self.input_keys.get(key)
        if i is None:
            i = self.input_keys[key] = len(self.inputs)
            self.inputs.append(t)
        return ("i", i)

    def _conflicts(self, reads: list[torch.Tensor], writes: list[torch.Tensor]) -> bool:
        """A read or write of a storage holding a pending value under another view."""
        if not self.storages:
            return False
        for t in reads:
            key = _key(t)
            if key not in self.values and key[0] in self.storages:
                return True
        for t in writes:
            key = _key(t)
            others = self.storages.get(key[0])
            if others and key not in others:
                return True
        return False

    def _out_shapes(self, fn: Callable, tensors: list[torch.Tensor]) -> object:
        import jax
        from tpusim.backend.lowering.dtypes import jax_dtype

        sig = (id(fn), tuple((tuple(t.shape), t.dtype) for t in tensors))
        shapes = self._shapes.get(sig)
        if shapes is None:
            specs = [jax.ShapeDtypeStruct(tuple(t.shape), jax_dtype(t.dtype)) for t in tensors]
            shapes = self._shapes[sig] = jax.eval_shape(fn, *specs)
        return shapes

    def _produce(self, dst: torch.Tensor) -> int:
        key = _key(dst)
        v = self.n_values
        self.n_values += 1
        self.values[key] = v
        self.value_dst[v] = dst
        self.storages.setdefault(key[0], set()).add(key)
        return v

    def add(self, op: object, info: object, fn: Callable, args: tuple, kwargs: dict, outs: dict) -> object:
        from tpusim.backend.lowering.dtypes import torch_dtype
        from tpusim.backend.targets.pjrt import _split

        tensors, _ = _split(args, kwargs)
        shapes = self._out_shapes(fn, tensors)
        multi = isinstance(shapes, (tuple, list))
        leaves = list(shapes) if multi else [shapes]
        if any(s is None or not hasattr(s, "shape") for s in leaves):
            return self._now(op, info, fn, args, kwargs, outs, "non-tensor output")
        if info.kind == "inplace" and tuple(args[0].shape) != tuple(leaves[0].shape):
            return self._now(op, info, fn, args, kwargs, outs, "resize")
        dsts = list(outs.values()) if info.kind == "out" else None
        if dsts is not None and any(tuple(d.shape) != tuple(s.shape) or d.dtype != torch_dtype(s.dtype)
                                    for d, s in zip(dsts, leaves)):
            return self._now(op, info, fn, args, kwargs, outs, "resize")
        targets = [args[0]] if info.kind == "inplace" else dsts
        if self._conflicts(tensors, targets or []):
            self.flush("alias")
        refs = [self._ref(t) for t in tensors]
        if targets is None:
            targets = [torch.empty(tuple(s.shape), dtype=torch_dtype(s.dtype)) for s in leaves]
        first = self.n_values
        for t in targets:
            v = self._produce(t)
            if dsts is None and info.kind != "inplace":
                self.fresh[v] = _uses(t)
        self.ops.append((fn, refs, len(targets), first, multi))
        self.stats.ops += 1
        result = targets[0] if info.kind == "inplace" else (
            (targets[0] if len(targets) == 1 else tuple(targets)) if dsts is not None else
            (tuple(targets) if multi else targets[0]))
        if len(self.ops) >= self.limit:
            self.flush("window full")
        return result

    def _now(self, op: object, info: object, fn: Callable, args: tuple, kwargs: dict, outs: dict,
             why: str) -> object:
        from tpusim.backend.targets.pjrt import _finish, _split, _to_jax

        self.flush(why)
        tensors, _ = _split(args, kwargs)
        result = fn(*[_to_jax(t) for t in tensors])
        self.stats.ops += 1
        self.stats.executions += 1
        return _finish(info, list(args), outs, result)

    # ------------------------------------------------------------ execution

    def _program(self, ops: list, n_inputs: int, live: list[int]) -> Callable:
        def run(*inputs: object) -> list:
            values: dict[int, object] = {}
            for fn, refs, n_out, first, multi in ops:
                args = [inputs[i] if kind == "i" else values[i] for kind, i in refs]
                out = fn(*args)
                outs = list(out) if multi else [out]
                for j in range(n_out):
                    values[first + j] = outs[j]
            return [values[v] for v in live]

        return run

    def flush(self, reason: str = "flush") -> None:
        if not self.ops:
            return
        import jax
        from tpusim.backend.targets.pjrt import _to_jax, _to_torch

        ops, inputs = self.ops, self.inputs
        # the last write of each view lands in memory, unless nobody holds that memory any more (a
        # fresh output whose device tensor died inside the window): XLA then drops its computation
        live = sorted(v for v in set(self.values.values())
                      if v not in self.fresh or _uses(self.value_dst[v]) > self.fresh[v])
        dsts = [self.value_dst[v] for v in live]
        sig = (tuple((id(fn), tuple(refs), n, first, multi) for fn, refs, n, first, multi in ops),
               tuple((tuple(t.shape), t.dtype) for t in inputs), tuple(live))
        self._clear()
        program = self.cache.get(sig)
        if program is None:
            program = self.cache[sig] = jax.jit(self._program(ops, len(inputs), live))
            self.stats.compiles += 1
        outs = program(*[_to_jax(t) for t in inputs])
        for dst, value in zip(dsts, outs):
            dst.copy_(_to_torch(value))
        self.stats.executions += 1
        self.stats.flushes[reason] = self.stats.flushes.get(reason, 0) + 1
