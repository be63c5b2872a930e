"""The eager mode a program runs in: Debug, Strict or Fused (process state, torch-free).

    import tpusim
    tpusim.set_eager_mode("debug")          # or TPUSIM_EAGER_MODE=debug, or tpusim run --mode debug
    with tpusim.eager_mode("fused"):
        ...
    tpusim.get_eager_mode()                 # "debug"; torch.tpu.get_eager_mode() says the same

Why a module of its own, outside the device: both layers read the mode. The tpu device
(tpusim/backend/) turns debug into real behaviour (every op's floating results checked for NaN/Inf at
the op, an optional one-line log per op: tpusim/backend/dispatch/debug_mode.py) and records each change in the
trace; the simulator prices any recorded program under every mode (tpusim/eager/modes.py).

The default is read once, at first use, from the environment: ``TPUSIM_EAGER_MODE`` (a mode
name) if set; else TorchTPU's variables with TorchTPU's precedence (its
``csrc/eager/eager_mode.cc``): ``TORCH_TPU_LAUNCH_BLOCKING`` (else the legacy
``TPU_LAUNCH_BLOCKING``) true means debug and wins; then ``TORCH_TPU_DEFER_AND_FUSE`` (else
``TPU_DEFER_AND_FUSE``) true means fused; else strict. Booleans are read as absl's SimpleAtob
reads them (1/0, true/false, yes/no, t/f, y/n, any case); like TorchTPU, a value that is neither
counts as unset, with a warning here.

On the sim target every op executes on host memory at once, in every mode, so numerics are
identical across modes and an op's error surfaces at the op, not at the next sync as it would
on an asynchronous device. Strict and fused differ only in cost (the simulator's queue
models); on the pjrt target fused regions really are compiled.

The modes themselves (names, what each does) are ``tpusim.eager.modes``' registry. A change of mode
is a window boundary: the device records it as ``HostRecord(event="dispatch",
reason="eager_mode:<new mode>")`` (``tpusim.trace.records.MODE_CHANGE_REASON``) so fusion never fuses
across it.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from tpusim.eager.modes import DEFAULT_MODE, MODES, get_mode
from tpusim.trace.records import MODE_CHANGE_REASON as CHANGE_REASON

__all__ = ["CHANGE_REASON", "DEFAULT_MODE", "ENV", "MODES", "eager_mode", "get_eager_mode", "on_change",
           "set_eager_mode"]
ENV = "TPUSIM_EAGER_MODE"

_mode: str | None = None                               # None until first read (then env or default)
_listeners: list[Callable[[str, str], None]] = []
# TorchTPU's variables: (public name, legacy name) -> the mode a true value selects; first true wins
TORCH_TPU_ENV: tuple[tuple[str, str, str], ...] = (
    ("TORCH_TPU_LAUNCH_BLOCKING", "TPU_LAUNCH_BLOCKING", "debug"),
    ("TORCH_TPU_DEFER_AND_FUSE", "TPU_DEFER_AND_FUSE", "fused"),
)
_TRUE, _FALSE = {"1", "true", "t", "yes", "y"}, {"0", "false", "f", "no", "n"}


def get_eager_mode() -> str:
    """The active eager mode: "debug", "strict" or "fused"."""
    global _mode
    if _mode is None:
        _mode = mode_from_environment(os.environ)
    return _mode


def mode_from_environment(environ: Mapping[str, str]) -> str:
    """The default eager mode the environment selects (see the module docstring)."""
    raw = environ.get(ENV, "").strip()
    if raw:
        return get_mode(raw, f" in {ENV}").name
    for public, legacy, mode in TORCH_TPU_ENV:
        value = _boolean(environ, public)
        if value is None:
            value = _boolean(environ, legacy)
        if value:
            return mode
    return DEFAULT_MODE


def _boolean(environ: Mapping[str, str], name: str) -> bool | None:
    raw = environ.get(name)
    if raw is None:
        return None
    value = raw.strip().lower()
    if value in _TRUE or value in _FALSE:
        return value in _TRUE
    warnings.warn(f"{name}={raw!r} is not a boolean (accepted: 1/0, true/false, yes/no); treated as unset, "
                  f"as TorchTPU does", stacklevel=3)
    return None


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
