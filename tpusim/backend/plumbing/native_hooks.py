"""Listeners of the shim's native kernels (``.item()``, copies): the shim calls one Python hook,
this module fans it out, so the recorder and the PJRT target's fused window can both listen.

    native_hooks.add(listener, first=True)      # listener(kind, a, b); kind "item" or "copy"
    native_hooks.remove(listener)

Item notifies before reading, copy after copying (tpusim/backend/csrc/kernels.cpp). Listeners added with
``first`` run before the others: the fused window must run pending work before anyone else looks.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from tpusim.backend.plumbing.state import STATE

Listener = Callable[[str, torch.Tensor, torch.Tensor | None], None]
_listeners: list[Listener] = []


def add(listener: Listener, first: bool = False) -> None:
    if listener in _listeners:
        return
    _listeners.insert(0 if first else len(_listeners), listener)
    STATE.shim.set_native_hook(_call)


def remove(listener: Listener) -> None:
    if listener in _listeners:
        _listeners.remove(listener)
    if not _listeners:
        STATE.shim.set_native_hook(None)          # no Python call at all from the native kernels


def _call(kind: str, a: torch.Tensor, b: torch.Tensor | None) -> None:
    for listener in list(_listeners):
        listener(kind, a, b)
