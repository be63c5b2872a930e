"""Every environment variable tpusim reads, with what it accepts: checked up front, one clear error.

Adding a variable = one row in ``VARIABLES`` (its name, what is accepted in words, the parser that
turns the raw text into a value or raises ``TpusimError``, and the default). ``tpusim run`` calls
``check()`` before it loads the device, so a bad value is one line naming the variable, its value and
what is accepted, instead of a failure deep inside the device's import. The modules that use a
variable read it with ``read(name)`` (or their own typed reader for the device's settings,
tpusim/backend/plumbing/config.py), so the check and the use cannot disagree.

TorchTPU's variables that select the eager mode (TORCH_TPU_LAUNCH_BLOCKING, ...) are TorchTPU's own:
tpusim/eager/state.py treats a non-boolean as unset with a warning, as TorchTPU does, so they are not here.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tpusim.eager.modes import MODES, get_mode
from tpusim.errors import TpusimError
from tpusim.hardware.spec import load_chip

# The one yes/no vocabulary of every boolean variable (``yes_no``), case-insensitive; blank is unset (the default).
ON, OFF = ("on", "1", "true", "yes"), ("off", "0", "false", "no")
YES_NO = "on, off (also 1/0, true/false, yes/no)"
# The record budget's default: a record costs about 0.8 KiB as a trace and each mode priced about 0.4-1 KiB
# more (benchmarks/bench_record_memory.py), so 600,000 records keep a long run under 2 GB of RSS even with
# --mode all (about 1 GB with the default mode alone).
MAX_RECORDS_DEFAULT = 600_000


@dataclass(frozen=True)
class Variable:
    """One environment variable: ``parse`` raises ValueError/TpusimError on a value it does not accept."""

    name: str
    accepted: str
    parse: Callable[[str], object]
    default: object = None


def _choice(*values: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        value = raw.strip().lower()
        if value not in values:
            raise ValueError(raw)
        return value
    return parse


def yes_no(raw: str) -> bool:
    """A boolean variable's value: one of ``ON`` (True) or ``OFF`` (False), any case; ValueError else."""
    value = raw.strip().lower()
    if value not in ON + OFF:
        raise ValueError(raw)
    return value in ON


def numerics_word(raw: str) -> str:
    """TPUSIM_NUMERICS: "tpu" (values as a TPU computes them), else a yes/no spelling as "on" or "off"."""
    value = raw.strip().lower()
    return "tpu" if value == "tpu" else "on" if yes_no(value) else "off"


def whole(low: int, high: int | None = None) -> Callable[[str], int]:
    """A whole number in [low, high]; float notation allowed (16e9), read exactly when it is an integer."""
    def parse(raw: str) -> int:
        text = raw.strip()
        if text.isascii() and text.lstrip("+-").isdigit():
            if len(text) > 4000:                 # Python's int-string limit is 4300 digits
                raise ValueError(raw)
            value = int(text)
        else:
            number = float(text) if text.isascii() else math.nan
            if not math.isfinite(number) or number != int(number):
                raise ValueError(raw)
            value = int(number)
        if value < low or (high is not None and value > high):
            raise ValueError(raw)
        return value
    return parse


def _seconds(raw: str) -> float:
    value = float(raw.strip()) if raw.strip().isascii() else math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(raw)
    return value


def _folder(raw: str) -> Path:
    path = Path(raw.strip()).expanduser()
    if not path.is_dir():
        raise ValueError(raw)
    return path


def _text(raw: str) -> str:
    return raw.strip()


def _eager_mode(raw: str) -> str:
    return get_mode(raw).name                  # the registry of modes (tpusim/eager/modes.py) owns the names


def _chip(raw: str) -> object:
    return load_chip(raw.strip())              # a chip name or a .toml path: the chip data decides


def _modes() -> str:
    return ", ".join(MODES)


VARIABLES: tuple[Variable, ...] = (
    # the device (tpusim/backend/plumbing/config.py)
    Variable("TPUSIM_CHIP", "a chip name (tpusim chips) or the path of a chip .toml file", _chip),
    Variable("TPUSIM_DEVICES", "a whole number 1..64", whole(1, 64)),
    Variable("TPUSIM_HBM_BYTES", "a whole number of bytes 0..2**62, e.g. 16e9 (0: unlimited)", whole(0, 2**62)),
    Variable("TPUSIM_NUMERICS", "on, off, tpu (on/off also 1/0, true/false, yes/no)", numerics_word, "on"),
    Variable("TPUSIM_F64", "warn, error, allow", _choice("warn", "error", "allow"), "warn"),
    Variable("TPUSIM_TARGET", "sim, pjrt", _choice("sim", "pjrt"), "sim"),
    Variable("TPUSIM_EAGER_MODE", "an eager mode: debug, strict, fused", _eager_mode),
    Variable("TPUSIM_DEBUG_CHECK", YES_NO, yes_no, True),
    Variable("TPUSIM_DEBUG_LOG", YES_NO, yes_no, False),
    Variable("TPUSIM_DUMP_STABLEHLO", "a folder to write each compiled graph's StableHLO into", _text),
    Variable("TPUSIM_XLA_OPS", YES_NO, yes_no, False),   # record eager ops' StableHLO (tpusim run --compiler)
    Variable("TPUSIM_MAX_RECORDS", "a whole number of records >= 0, e.g. 2e6 (0: no limit)", whole(0),
             MAX_RECORDS_DEFAULT),
    # distributed (tpusim/backend/distributed/)
    Variable("TPUSIM_RANKS", "one, all", _choice("one", "all")),
    Variable("TPUSIM_HANG_TIMEOUT_S", "seconds > 0, e.g. 300", _seconds, 300.0),
    Variable("TPUSIM_HANG_GRACE_S", "seconds > 0, e.g. 1", _seconds, 1.0),
    # data (tpusim/hardware/spec.py)
    Variable("TPUSIM_TOPOLOGIES", "an existing folder holding chips/*.toml (a copy of topologies/)", _folder),
    # TorchTPU's, read by tpusim/backend/plumbing/config.py
    Variable("TORCH_TPU_DEVICES_PER_HOST", "a whole number >= 1", whole(1)),
)
BY_NAME = {v.name: v for v in VARIABLES}


def _shown(raw: str) -> str:
    return repr(raw if len(raw) <= 200 else raw[:200] + "...")


def read(name: str, environ: Mapping[str, str] | None = None) -> object:
    """The value of variable ``name`` (its default when unset or blank); a bad value is a TpusimError."""
    var = BY_NAME[name]
    raw = (os.environ if environ is None else environ).get(name, "")
    if not raw.strip():
        return var.default
    try:
        return var.parse(raw)
    except TpusimError as error:
        raise TpusimError(f"{name}={_shown(raw)}: {error}") from None
    except (ValueError, OverflowError, OSError, RuntimeError):     # RuntimeError: a "~nosuchuser" path
        accepted = var.accepted if name != "TPUSIM_EAGER_MODE" else f"an eager mode: {_modes()}"
        raise TpusimError(f"{name}={_shown(raw)}; accepted: {accepted}") from None


def check(environ: Mapping[str, str] | None = None, skip: tuple[str, ...] = ()) -> None:
    """Read every variable that is set (but those in ``skip``): one TpusimError listing each bad one."""
    problems = []
    for var in VARIABLES:
        if var.name in skip:
            continue
        try:
            read(var.name, environ)
        except TpusimError as error:
            problems.append(str(error))
    if problems:
        raise TpusimError("\n".join(problems))
