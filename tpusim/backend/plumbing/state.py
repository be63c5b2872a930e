"""Process-wide state of the tpu device, in one object read on every op (attribute access only).

Filled by tpusim/backend/device/registration.py at registration (and again by ``configure``); the recorder flips
``recording``, the eager mode ``debug`` (tpusim/backend/dispatch/debug_mode.py); ``target`` is the execution target
the device holds (tpusim/backend/targets/base.py ``use``). A leaf module: it imports nothing of the
backend, so every module can read it.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any


class _State:
    shim: ModuleType | Any = None             # the compiled C++ shim (tpusim/backend/plumbing/shim.py)
    config: Any = None                        # backend.config.DeviceConfig in effect
    numerics: bool = True                     # False in shape-only mode
    host_device: Any = None                   # torch.device("cpu"), or "meta" in shape-only mode
    default_generators: tuple = ()            # torch.Generator per tpu device
    recording: bool = False                   # a recorder is active (tpusim/backend/program_trace/recorder.py)
    debug: bool = False                       # debug eager mode's per-op check or log is on (dispatch/debug_mode.py)
    target: Any = None                        # the held targets.base.Target: computes every op's values


STATE = _State()
