"""At interpreter exit, autograd's tpu threads let go of the last backward before Python finalizes.

PyTorch's backward stashes a Python object (a copy of the contextvars context) in the thread-local state
that its GraphTask captures. A tpu backward runs on autograd's device thread for "tpu"; when that thread
drops the last reference to the task after Python has begun to finalize, the decref needs the GIL, Python
ends the thread mid-unwind and the process aborts ("terminate called without an active exception", exit
134), at random, after the script itself succeeded. A device thread drops its task before it takes the
next one from its queue, so one tiny backward per device, queued at exit (while Python still runs) and
started without the stash, proves every earlier task dropped; its own task holds no Python object.
After it, any other thread that still runs a tpu op (a daemon thread's loop) parks in the shim for good
rather than return to a finalizing Python (the same abort, issue 32, row 9).
"""

from __future__ import annotations

import atexit
import os
import threading
import time

import torch

from tpusim.backend.plumbing.state import STATE

PARK_S = 0.05                       # enough for any op in flight to end (ops here take microseconds to ms)
THREAD_PREFIX = "pt_autograd_"      # what autograd names its device threads (/proc/self/task/*/comm)
_KEPT: list[tuple[torch.Tensor, ...]] = []   # the drain's tensors, alive until the process ends


def device_threads_started() -> bool:
    """Whether autograd started its device threads in this process (a backward ran off the CPU)."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:                 # no /proc: assume they may exist
        return True
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm") as comm:
                if comm.read().startswith(THREAD_PREFIX):
                    return True
        except OSError:             # the thread ended meanwhile
            continue
    return False


def drain_device_threads(device_type: str) -> None:
    """Run a one-op backward on each ``device_type`` device through the engine directly (no stashed
    Python object), so each device thread has finished with every earlier task when it returns. The
    gradient accumulates into the leaf (the task returns nothing) and the tensors stay referenced here, so
    whichever thread drops the drain's own task last frees no Python object."""
    module = getattr(torch, device_type)
    for index in range(module.device_count()):
        leaf = torch.zeros((), device=torch.device(device_type, index), requires_grad=True)
        root = leaf * 1
        seed = torch.ones_like(root)
        _KEPT.append((leaf, root, seed))
        torch.autograd.Variable._execution_engine.run_backward((root,), (seed,), False, False, (), True, True)


def _at_exit(device_type: str) -> None:
    if device_threads_started():
        try:
            drain_device_threads(device_type)
        except BaseException:       # the device already torn down: nothing left to drain, nothing to report
            pass
    shim = STATE.shim
    if shim is not None:            # after the drain (it runs on autograd's threads): see park_if_exiting
        shim.park_other_threads()
        if threading.active_count() > 1:
            time.sleep(PARK_S)      # a thread inside an op when the exit began reaches its park on the way out


def install(device_type: str) -> None:
    atexit.register(_at_exit, device_type)
