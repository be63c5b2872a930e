"""TorchTPU's eager modes by its own names: ``EagerMode``, ``torch.tpu.eager_mode``, ``set_eager_mode``.

    torch.tpu.eager_mode = torch.tpu.EagerMode.DEFER_AND_FUSE        # the whole program from here on
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING):
        loss = model(x)                                                 # this block only

The modes are tpusim/eager/modes.py's registry: each member of ``EagerMode`` is one of its TorchTPU aliases,
and its value is the tpusim mode it names (``EagerMode.DEFER_AND_FUSE == "fused"``: members are strings); the process
state is tpusim/eager/state.py's, so ``tpusim.eager_mode``, TPUSIM_EAGER_MODE and TorchTPU's variables
(TORCH_TPU_LAUNCH_BLOCKING, TORCH_TPU_DEFER_AND_FUSE) all act on the same mode.
"""

from __future__ import annotations

import enum

from tpusim.eager import state as eager
from tpusim.eager.modes import MODES, get_mode
from tpusim.errors import TpusimError

EagerMode = enum.Enum("EagerMode", {alias.upper(): mode.name for mode in MODES.values() for alias in mode.aliases},
                      module=__name__, type=str)
EagerMode.__doc__ = ("TorchTPU's eager modes (torch_tpu execution_mode EagerMode): DEFER_NEVER is tpusim's strict, "
                     "DEFER_NEVER_AND_LAUNCH_BLOCKING its debug, DEFER_AND_FUSE its fused (the member's value)")


def _tpusim_name(mode: object) -> str:
    """The tpusim mode an ``EagerMode`` member or a mode name ("DEFER_AND_FUSE", "fused") stands for."""
    if isinstance(mode, EagerMode):
        return mode.value
    if isinstance(mode, str):
        return get_mode(mode, " given to torch.tpu").name
    raise TpusimError(f"torch.tpu eager mode {mode!r}: expected a torch.tpu.EagerMode member "
                      f"({', '.join(EagerMode.__members__)}) or a mode name")


def get_eager_mode() -> EagerMode:
    """The active mode as a TorchTPU ``EagerMode`` member (``torch.tpu.eager_mode``)."""
    return EagerMode(eager.get_eager_mode())


def set_global_eager_mode(mode: object) -> None:
    """``torch.tpu.eager_mode = mode``: the whole program from here on."""
    eager.set_eager_mode(_tpusim_name(mode))


class set_eager_mode:  # noqa: N801  (TorchTPU's name; a context manager that also works as a call)
    """Switch to ``mode`` now; used as ``with torch.tpu.set_eager_mode(mode):`` the previous mode comes back
    after the block (also on error). Called without ``with``, the switch stays, as an assignment to
    ``torch.tpu.eager_mode`` would."""

    def __init__(self, mode: object) -> None:
        self.mode = EagerMode(_tpusim_name(mode))
        self.previous = EagerMode(eager.set_eager_mode(self.mode.value))

    def __enter__(self) -> EagerMode:
        return self.mode

    def __exit__(self, *exc: object) -> bool:
        eager.set_eager_mode(self.previous.value)
        return False
