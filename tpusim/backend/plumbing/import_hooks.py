"""Run a function when (and if) a module is imported: a post-import hook on ``sys.meta_path``.

Why: some takeovers need a module that is heavy to import (Dynamo, Inductor: seconds), so they
must not import it themselves; they run once the program does. ``after_import(name, fn)`` calls
``fn(module)`` right after ``name`` executes, or at once when it already has. Used by
tpusim/backend/device/dynamo_inductor.py (Dynamo's and Inductor's "tpu" entries) and
tpusim/backend/torch_compile/jax_backend.py (the ``backend="tpu"`` name for torch.compile).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from types import ModuleType


class _Loader(importlib.abc.Loader):
    """Runs each of ``after`` on the module once the wrapped loader has executed it."""

    def __init__(self, inner: importlib.abc.Loader, after: list[Callable[[ModuleType], None]]) -> None:
        self.inner, self.after = inner, after

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        for after in self.after:
            after(module)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.hooks: dict[str, list[Callable[[ModuleType], None]]] = {}

    def find_spec(self, name: str, path: object, target: object = None) -> importlib.machinery.ModuleSpec | None:
        after = self.hooks.get(name)
        if after is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                del self.hooks[name]
                spec.loader = _Loader(spec.loader, after)
                return spec
        return None


_FINDER = _PostImportFinder()


def after_import(name: str, fn: Callable[[ModuleType], None]) -> None:
    """Call ``fn(module)`` once module ``name`` is imported (now, if it already is)."""
    if name in sys.modules:
        fn(sys.modules[name])
        return
    _FINDER.hooks.setdefault(name, []).append(fn)      # several takeovers may wait for one module
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
