"""Process-wide state of the tpu device, in one object read on every op (attribute access only).

Filled by backend/device.py at registration; the recorder flips ``recording``, the eager mode
``debug`` (backend/debug.py).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any


class _State:
    shim: ModuleType | Any = None             # the compiled C++ shim (backend/shim.py)
    config: Any = None                        # backend.config.DeviceConfig
    numerics: bool = True                     # False in shape-only mode
    host_device: Any = None                   # torch.device("cpu"), or "meta" in shape-only mode
    default_generators: tuple = ()            # torch.Generator per tpu device
    recording: bool = False                   # a recorder is active (backend/recorder.py)
    debug: bool = False                       # debug eager mode's per-op check or log is on (backend/debug.py)


STATE = _State()
