"""Activation offload to the host: which device->host copies keep an activation rather than read a value.

A copy to the host is an *offload* when it is ``non_blocking`` (the program cannot read it before a sync), lands
in pinned memory (a transfer buffer), or is made by a saved-tensors pack hook (``torch.autograd.graph.save_on_cpu``,
``saved_tensors_hooks``, ``offload_wrapper``). The shim (csrc/kernels.cpp ``is_offload``) asks this module only
for the last, and only once the thread's saved-tensors hook stack is non-empty. Why it matters:

- in shape-only mode (``--numerics off``) an offload is allowed, and its host copy holds no values; any other
  copy to the host still raises, since the program would read values that do not exist;
- while recording, an offload is a ``d2h`` HostRecord with reason ``offload``, its host buffer tracked (host
  memory held: ``TraceMeta.host_peak_bytes``), and the engine prices it on the chip's PCIe link.
"""

from __future__ import annotations

import functools
import sys
from types import CodeType

import torch

from tpusim.trace.records import OFFLOAD_REASON

__all__ = ["OFFLOAD_REASON", "in_pack_hook", "install"]


def _code_of(hook: object) -> CodeType | None:
    """The code object a pack hook runs: a function's, a bound method's, a partial's function's, or a callable
    object's ``__call__``."""
    while isinstance(hook, functools.partial):
        hook = hook.func
    hook = getattr(hook, "__func__", hook)
    code = getattr(hook, "__code__", None)
    if code is None and callable(hook):
        call = type(hook).__call__
        code = getattr(getattr(call, "__func__", call), "__code__", None)
    return code if isinstance(code, CodeType) else None


def in_pack_hook() -> bool:
    """Whether the innermost saved-tensors pack hook is on the Python stack now (its copy saves an activation)."""
    hooks = torch._C._autograd._top_saved_tensors_default_hooks(True)
    if hooks is None:
        return False
    code = _code_of(hooks[0])
    if code is None:
        return False
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False


def install(shim: object) -> None:
    """Let the shim ask ``in_pack_hook`` (tpusim/backend/dispatch/fallback.py's install, at registration)."""
    shim.set_pack_hook_check(in_pack_hook)
