"""The eager mode a program runs in: Debug, Strict or Fused (process state, torch-free).

    import tpusim
    tpusim.set_eager_mode("debug")          # or TPUSIM_EAGER_MODE=debug, or tpusim run --mode debug
    with tpusim.eager_mode("fused"):
        ...
    tpusim.get_eager_mode()                 # "debug"; torch.tpu.get_eager_mode() says the same

Why a module of its own, outside the device: both layers read the mode. The tpu device
(backend/) turns debug into real behaviour (every op's floating results checked for NaN/Inf at
the op, an optional one-line log per op: backend/debug.py) and records each change in the
trace; the simulator prices any recorded program under every mode (tpusim/modes.py). The
default comes from ``TPUSIM_EAGER_MODE`` (read at first use), else strict.

On the sim target every op executes on host memory at once, in every mode, so numerics are
identical across modes and an op's error surfaces at the op, not at the next sync as it would
on an asynchronous device. Strict and fused differ only in cost (the simulator's queue
models); on the pjrt target fused regions really are compiled.

The modes themselves (names, what each does) are ``tpusim.modes``' registry. A change of mode
is a window boundary: the device records it as ``HostRecord(event="dispatch",
reason="eager_mode:<new mode>")`` (``tpusim.trace.MODE_CHANGE_REASON``) so fusion never fuses
across it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from tpusim.modes import DEFAULT_MODE, MODES, get_mode
from tpusim.trace import MODE_CHANGE_REASON as CHANGE_REASON

__all__ = ["CHANGE_REASON", "DEFAULT_MODE", "ENV", "MODES", "eager_mode", "get_eager_mode", "on_change",
           "set_eager_mode"]
ENV = "TPUSIM_EAGER_MODE"

_mode: str | None = None                               # None until first read (then env or default)
_listeners: list[Callable[[str, str], None]] = []


def get_eager_mode() -> str:
    """The active eager mode: "debug", "strict" or "fused"."""
    global _mode
    if _mode is None:
        raw = os.environ.get(ENV, "").strip()
        _mode = get_mode(raw, f" in {ENV}").name if raw else DEFAULT_MODE
    return _mode


def set_eager_mode(mode: str) -> str:
    """Switch the process to ``mode``; returns the previous mode. Listeners (the tpu device) hear
    of every real change, so the device applies it and the trace marks it."""
    global _mode
    new = get_mode(mode).name
    old = get_eager_mode()
    _mode = new
    if new != old:
        for listener in list(_listeners):
            listener(old, new)
    return old


@contextmanager
def eager_mode(mode: str) -> Iterator[str]:
    """Run the block in ``mode`` and restore the previous mode after it (also on error)."""
    old = set_eager_mode(mode)
    try:
        yield get_eager_mode()
    finally:
        set_eager_mode(old)


def on_change(listener: Callable[[str, str], None]) -> None:
    """Call ``listener(old, new)`` after each change of mode (idempotent per listener)."""
    if listener not in _listeners:
        _listeners.append(listener)
