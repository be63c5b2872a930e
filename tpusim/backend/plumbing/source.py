"""The user's source line for a record: the first Python frame outside torch and tpusim.

Cheap by design, because it runs for every recorded op: once the device is registered the walk
is the shim's (tpusim/backend/csrc/record.cpp, which asks ``is_internal_file`` here once per code
object); before that, a ``sys._getframe`` walk with the same per-code-object cache. Ops issued
by the autograd engine (backward) are attributed to the forward line that created their autograd node (the
shim keeps each forward op's line by the node's thread and sequence number, as the profiler ties them); ops of a
node no recorded op created go to the line the main thread is waiting on (the ``loss.backward()`` call).
"""

from __future__ import annotations

import os
import sys
import threading

import torch
import typing_extensions

_INTERNAL_DIRS = (
    os.path.dirname(torch.__file__) + os.sep,                             # torch
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep,  # tpusim/ (all of it)
)
# Files whose frames wrap torch's own functions: typing_extensions' @deprecated wraps
# torch.distributed.all_gather_into_tensor, and a mismatch there named typing_extensions.py:3140 (issue 32, row 7).
_WRAPPER_FILES = tuple(os.path.abspath(module.__file__) for module in (typing_extensions,))
_TENSOR_STR = os.path.join(os.path.dirname(torch.__file__), "_tensor_str.py")
_internal: dict[object, bool] = {}
_MAIN = threading.main_thread()
_native = None      # the shim's walk, once installed: () -> (source, printing)


def is_internal_file(name: str) -> bool:
    """True for torch's, tpusim's and the interpreter's own files: never the user's line."""
    return (name.startswith(_INTERNAL_DIRS) or name.startswith("<frozen") or "/contextlib.py" in name
            or name in _WRAPPER_FILES)


def _is_internal(code: object) -> bool:
    flag = _internal.get(code)
    if flag is None:
        flag = _internal[code] = is_internal_file(code.co_filename)
    return flag


def _walk(frame: object) -> tuple[str, bool]:
    printing = False
    while frame is not None:
        code = frame.f_code
        if not _is_internal(code):
            return f"{os.path.basename(code.co_filename)}:{frame.f_lineno}", printing
        if code.co_filename == _TENSOR_STR:
            printing = True
        frame = frame.f_back
    return "", printing


def install(shim: object) -> None:
    """Walk in the shim from now on (tpusim/backend/dispatch/fallback.py's install, at registration)."""
    global _native
    shim.configure_source(is_internal_file, _TENSOR_STR, _MAIN.ident)
    _native = shim.user_source


def user_source_and_print() -> tuple[str, bool]:
    """("file.py:line", whether the value is being read by print/repr)."""
    if _native is not None:
        return _native()
    found, printing = _walk(sys._getframe(1))
    if found or threading.current_thread() is _MAIN:
        return found, printing
    main = sys._current_frames().get(_MAIN.ident)
    found, _ = _walk(main)
    return found, printing


def user_source() -> str:
    return user_source_and_print()[0]
