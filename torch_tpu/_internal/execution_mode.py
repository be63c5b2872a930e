"""``torch_tpu._internal.execution_mode``: TorchTPU's eager modes, the same process state as ``torch.tpu``'s.

    from torch_tpu._internal import execution_mode as em
    with em.set_eager_mode(em.EagerMode.DEFER_AND_FUSE):     # or em.eager_mode(...): the block only
        ...
    em.eager_mode = em.EagerMode.DEFER_NEVER                 # the whole program from here on
    em.get_eager_mode()                                      # an EagerMode member

``EagerMode`` is ``torch.tpu.EagerMode`` (tpusim/backend/torchtpu/modes.py; TorchTPU's internal
INTERNAL_DEFER_ALL is absent). A Fused block (DEFER_AND_FUSE) entered with either context manager also keeps
the graph of pending ops that ``sync.computation_mlir`` prints (tpusim/backend/torchtpu/deferred.py).
Assigning ``em.eager_mode`` switches the mode, as TorchTPU's notebook says it does (in TorchTPU's module the
assignment would only rebind the name); reading it gives the context manager. ``cpu_fallback_mode`` changes
nothing: every op already runs (on the host's CPU kernels).
"""

import contextlib
import sys
from collections.abc import Iterator
from types import ModuleType

from tpusim.backend.torchtpu import deferred, modes

EagerMode = modes.EagerMode
get_eager_mode = modes.get_eager_mode


class set_eager_mode(modes.set_eager_mode):  # noqa: N801  (TorchTPU's name)
    """Switch to ``mode`` now; as ``with``, the previous mode returns after the block, and a Fused block keeps
    its pending ops for ``sync.computation_mlir``."""

    def __enter__(self) -> modes.EagerMode:
        self._pending = contextlib.ExitStack()
        if self.mode == EagerMode.DEFER_AND_FUSE:
            self._pending.enter_context(deferred.capturing())
        return super().__enter__()

    def __exit__(self, *exc: object) -> bool:
        self._pending.close()
        return super().__exit__(*exc)


@contextlib.contextmanager
def eager_mode(mode: modes.EagerMode) -> Iterator[None]:
    """Run the block in ``mode`` (TorchTPU's push/pop of the mode): the previous one returns after it."""
    with set_eager_mode(mode):
        yield


@contextlib.contextmanager
def cpu_fallback_mode(enabled: bool) -> Iterator[None]:
    """TorchTPU's switch for running unsupported ops on the CPU: every op runs here already."""
    yield


class _ExecutionModeModule(ModuleType):
    eager_mode = property(lambda self: eager_mode, lambda self, value: modes.set_global_eager_mode(value),
                          doc="The context manager; assign an EagerMode member to switch the whole program.")


sys.modules[__name__].__class__ = _ExecutionModeModule
__all__ = ["EagerMode", "cpu_fallback_mode", "eager_mode", "get_eager_mode", "set_eager_mode"]
