"""TorchTPU's matmul precision: ``Precision``, ``precision(...)``, ``allow_excess_precision``.

    with torch.tpu.precision(torch.tpu.Precision.HIGHEST):
        y = x @ w                                 # an f32 matmul at full precision: 6 bf16 passes on the MXU
    torch.tpu.allow_excess_precision = True       # also torch.backends.tpu.allow_excess_precision

``Precision`` is StableHLO's ``dot_general`` precision (openxla.org/stablehlo/spec#dot_general): on a TPU
an f32 matmul at DEFAULT rounds its operands to bf16 and takes one MXU pass, HIGH takes three (bf16_3x),
HIGHEST six (bf16_6x). With numerics on (the default) tpusim's numbers stay CPU's f32 at every precision
(so results match CPU exactly); with ``--numerics tpu`` (TPUSIM_NUMERICS=tpu) f32 matmuls, convolutions and
attention are computed as the TPU computes them at the precision in effect, and a compiled graph keeps its
bf16 values in f32 while ``allow_excess_precision`` is on (tpusim/backend/dispatch/tpu_numerics.py, which reads both
settings from here). Either way the price changes: the precision in effect is recorded in the trace meta
(``TraceMeta.matmul_precision``: the highest one used while recording, with its bf16 pass count) for the
simulator to price f32 matmuls at that many passes. ``allow_excess_precision`` (XLA's
``--xla_allow_excess_precision``, default off as in TorchTPU, read from XLA_FLAGS until set) lets XLA
keep bf16 values in f32 between the ops of one compiled program; it is recorded beside the precision.
Nothing is recorded for a program that never touches these settings (DEFAULT, one pass, is the default).
As in TorchTPU, ``torch.set_float32_matmul_precision`` and ``torch.backends``' fp32 settings change nothing
here: TorchTPU's precision is its own context (DEFAULT unless ``torch.tpu.precision`` says otherwise).
"""

from __future__ import annotations

import contextlib
import enum
import os
from collections.abc import Iterator

from tpusim.backend.dispatch import tpu_numerics
from tpusim.backend.plumbing.state import STATE
from tpusim.backend.program_trace import recorder
from tpusim.errors import TpusimError
from tpusim.trace.records import MatmulPrecision


class Precision(enum.Enum):
    """StableHLO dot_general precision (TorchTPU's ``torch.tpu.Precision``); the value is its name in the trace."""

    DEFAULT = "default"
    HIGH = "high"
    HIGHEST = "highest"


BF16_PASSES = {Precision.DEFAULT: 1, Precision.HIGH: 3, Precision.HIGHEST: 6}   # XLA: bf16, bf16_3x, bf16_6x
_ORDER = list(Precision)


class _State:
    stack: list[Precision] = []             # innermost precision() block last
    allow_excess: bool | None = None        # None: not set, XLA_FLAGS says
    touched = False                         # the program used a precision setting: record it
    highest = Precision.DEFAULT             # the highest precision in effect since the last recording stopped


_S = _State()


def current() -> Precision:
    """The precision f32 matmuls run at now: the innermost ``precision`` block's, else DEFAULT."""
    return _S.stack[-1] if _S.stack else Precision.DEFAULT


def _xla_flag() -> bool:
    """``--xla_allow_excess_precision[=true|false]`` in XLA_FLAGS (default false, as TorchTPU's)."""
    value = False
    for flag in os.environ.get("XLA_FLAGS", "").split():
        name, _, raw = flag.partition("=")
        if name == "--xla_allow_excess_precision":
            text = raw.strip().lower() or "true"
            if text not in ("true", "false", "1", "0"):
                raise TpusimError(f"XLA_FLAGS: --xla_allow_excess_precision={raw!r}; accepted: true, false")
            value = text in ("true", "1")
            _S.touched = True
    return value


def get_allow_excess_precision() -> bool:
    """Whether XLA may keep bf16 values in f32 between ops (``torch.tpu.allow_excess_precision``)."""
    if _S.allow_excess is None:
        _S.allow_excess = _xla_flag()
    return _S.allow_excess


def set_allow_excess_precision(value: bool) -> None:
    if not isinstance(value, bool):
        raise TpusimError(f"torch.tpu.allow_excess_precision = {value!r}; accepted: True or False")
    _S.allow_excess = value
    _S.touched = True
    _note()


@contextlib.contextmanager
def precision(mode: Precision) -> Iterator[None]:
    """Run the block's f32 matmuls at ``mode`` (TorchTPU's ``torch.tpu.precision``); nests, innermost wins."""
    if not isinstance(mode, Precision):
        raise TpusimError(f"torch.tpu.precision({mode!r}): expected one of "
                          f"{', '.join('torch.tpu.Precision.' + p.name for p in Precision)}")
    _S.stack.append(mode)
    _S.touched = True
    _note()
    try:
        yield
    finally:
        _S.stack.pop()


def _note() -> None:
    """Remember the highest precision in effect, and tell the active recording."""
    now = current()
    if _ORDER.index(now) > _ORDER.index(_S.highest):
        _S.highest = now
    if STATE.recording:
        recorder.set_meta("matmul_precision", _fact(_S.highest))


def _fact(mode: Precision) -> MatmulPrecision:
    return MatmulPrecision(mode.value, BF16_PASSES[mode], get_allow_excess_precision())


def trace_meta() -> dict:
    """Recorder meta source: ``matmul_precision`` when the program used a precision setting."""
    get_allow_excess_precision()                  # XLA_FLAGS counts as a setting
    if not _S.touched:
        return {}
    fact = _fact(max(_S.highest, current(), key=_ORDER.index))
    _S.highest = current()
    return {"matmul_precision": fact}


class _TpuBackendConfig:
    """``torch.backends.tpu`` (TorchTPU's _TpuBackendConfig): ``allow_excess_precision``."""

    allow_excess_precision = property(lambda self: get_allow_excess_precision(),
                                      lambda self, value: set_allow_excess_precision(value))


BACKEND_CONFIG = _TpuBackendConfig()
recorder.add_meta_source(trace_meta)
tpu_numerics.use_settings(lambda: current().value, get_allow_excess_precision)
