"""Debug eager mode on the device: each op's floating results are checked for NaN/Inf at the op.

Why: on a real TPU a NaN made early in a step surfaces much later (or never); debug mode
(``tpusim.set_eager_mode("debug")``, tpusim/eager/state.py) stops the program at the op that made it,
naming the op, its shapes and the user's source line. The check runs isfinite on the host
aliases with CPU kernels: no device op, nothing recorded (the simulator prices debug's checks
itself, tpusim/eager/modes.py).

An op is blamed only when it *introduced* the value: its floating inputs were finite (those it
also writes checked before the op) and no float argument is NaN/Inf. An op that propagates a NaN
it was given, or fills a -inf attention mask on purpose, is not blamed. Shape-only mode
(TPUSIM_NUMERICS=off) has no values: nothing is checked.

Knobs (read at import; ``configure`` changes them at run time):
TPUSIM_DEBUG_CHECK  "on" (default) or "off": the NaN/Inf check in debug mode
TPUSIM_DEBUG_LOG    "on": one line per op on stderr in debug mode (default off)
(both yes/no as tpusim/envvars.py reads every boolean variable: on/off, 1/0, true/false, yes/no)

On the pjrt target a comparison with a CPU recomputation of each op would also belong here;
on the sim target the op *is* the CPU computation, so there is nothing to compare.
"""

from __future__ import annotations

import cmath
import sys

import torch

from tpusim import envvars
from tpusim.backend.plumbing.source import user_source
from tpusim.backend.plumbing.state import STATE
from tpusim.backend.program_trace import recorder
from tpusim.eager import state as eager

CHECK = envvars.read("TPUSIM_DEBUG_CHECK")     # on by default; yes/no as tpusim/envvars.py reads it
LOG = envvars.read("TPUSIM_DEBUG_LOG")         # off by default
_MODE = "strict"


class TpuNonFiniteError(RuntimeError):
    """Debug mode found NaN or Inf made by an op (the message names the op, shapes and source line)."""


def configure(check: bool | None = None, log: bool | None = None) -> None:
    """Turn debug mode's NaN/Inf check or per-op log on or off at run time."""
    global CHECK, LOG
    CHECK = CHECK if check is None else bool(check)
    LOG = LOG if log is None else bool(log)
    apply_mode(_MODE)


def apply_mode(mode: str) -> None:
    """Set the fallback's one flag (``STATE.debug``) for ``mode``; called at each change of mode."""
    global _MODE
    _MODE = mode
    STATE.debug = mode == "debug" and (CHECK or LOG)


def on_change(old: str, new: str) -> None:
    """The device's part of a change of eager mode (tpusim/backend/device/registration.py calls it
    first): apply the mode and mark the change in the trace (a window boundary)."""
    apply_mode(new)
    if STATE.recording:
        recorder.record_host("dispatch", f"{eager.CHANGE_REASON}{new}")


def _floating(t: object) -> bool:
    return isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex()) and t.numel() > 0


def _finite(t: torch.Tensor) -> bool:
    host = STATE.shim.host_alias(t) if t.device.type == "tpu" else t
    return bool(torch.isfinite(host).all())


def before(plan: object, args: tuple, kwargs: dict, inputs: list[torch.Tensor]) -> bool:
    """Whether an input the op also writes (in place, or as its out=) already holds NaN/Inf: its
    values are gone after the op."""
    if not CHECK or not STATE.numerics:
        return False
    written = [args[i] for i in plan.mutable_pos if i < len(args)]
    written += [kwargs[k] for k in plan.mutable_kw if k in kwargs]
    return any(_floating(t) and any(t is w for w in written) and not _finite(t) for t in inputs)


def _given_bad(a: object) -> bool:
    """A non-finite value the program passed in: a float argument or a host tensor (-inf masks)."""
    if isinstance(a, (float, complex)):
        return not cmath.isfinite(a)
    return isinstance(a, torch.Tensor) and a.device.type != "tpu" and _floating(a) and not _finite(a)


def _shape(t: torch.Tensor) -> str:
    return f"{list(t.shape)} {str(t.dtype)[6:]}"


def _flat(obj: object, acc: list) -> list:
    if isinstance(obj, (list, tuple)):
        for o in obj:
            _flat(o, acc)
    elif isinstance(obj, dict):
        for o in obj.values():
            _flat(o, acc)
    else:
        acc.append(obj)
    return acc


def after(name: str, inputs: list[torch.Tensor], out: object, mutated: list[torch.Tensor], args: tuple,
          kwargs: dict, input_bad: bool) -> None:
    """Log the op and check its floating results; raise ``TpuNonFiniteError`` when it made NaN/Inf."""
    outs = [o for o in _flat(out, []) if isinstance(o, torch.Tensor) and o.device.type == "tpu"]
    outs += [m for m in mutated if not any(m is o for o in outs)]
    if LOG:
        where = user_source()
        print(f"tpusim debug: {name} ({', '.join(_shape(t) for t in inputs)}) -> "
              f"({', '.join(_shape(t) for t in outs)}){' at ' + where if where else ''}", file=sys.stderr)
    if not CHECK or not STATE.numerics or input_bad:
        return
    bad = [(i, o) for i, o in enumerate(outs) if _floating(o) and not _finite(o)]
    if not bad:
        return
    if any(_given_bad(a) for a in _flat((args, kwargs), [])) or \
            any(_floating(t) and not _finite(t) for t in inputs if not any(t is m for m in mutated)):
        return                                      # it propagated or was given a non-finite value
    index, t = bad[0]
    host = STATE.shim.host_alias(t)
    nans, infs = int(torch.isnan(host).sum()), int(torch.isinf(host).sum())
    where = user_source()
    raise TpuNonFiniteError(
        f"tpusim debug mode: {name}{' at ' + where if where else ''} produced non-finite values from finite "
        f"inputs: output {index} ({_shape(t)}) has {nans} NaN and {infs} Inf of {t.numel()}; inputs: "
        f"{', '.join(_shape(i) for i in inputs) or 'none'}. (TPUSIM_DEBUG_CHECK=off or another eager mode "
        f"turns the check off.)")
