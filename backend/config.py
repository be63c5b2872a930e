"""The tpu device's settings: one typed ``DeviceConfig``, handed over by a caller or read from the environment.

A caller that knows what it wants (``tpusim run``) builds a ``DeviceConfig`` and hands it to
``tpusim.backend.configure(config)`` before the first tensor on the device (the chip is the
``ChipSpec`` itself, so a chip loaded from any TOML file works). A plain ``python script.py`` or
torchrun user sets environment variables instead, read once, at import, by ``load_config``:

TPUSIM_CHIP        chip generation simulated (a topologies/chips/*.toml name, or a TOML file's
                   path), default: the chip file marked ``default = true`` (v5p): gives the HBM
                   capacity per device and the number of devices (chips per host)
TPUSIM_DEVICES     number of tpu devices in this process, 1..64 (default: the chip's chips per host)
TPUSIM_HBM_BYTES   HBM capacity per device in bytes (default: the chip's; 0 = unlimited)
TPUSIM_NUMERICS    "on" (default) or "off": shape-only mode, no host memory, values unreadable
TPUSIM_F64         "warn" (default): float64/complex ops run on the host with a warning once
                   per op; "error": they raise; "allow": silent
TPUSIM_TARGET      "sim" (default): ops computed by CPU kernels on host memory; "pjrt": through
                   JAX (backend/targets/)
TPUSIM_DEVICE_CONFIG  a whole DeviceConfig as JSON (``DeviceConfig.env()``): how a process hands
                   its config to the worker processes it starts (``--ranks all`` ranks); when
                   set, the variables above are not read

A bad value raises one ``TpusimError`` naming the variable, its value and what is accepted.

Read elsewhere, next to what they drive: TPUSIM_EAGER_MODE (tpusim/eager.py: debug, strict or
fused; ``DeviceConfig.eager_mode`` overrides it), TPUSIM_DEBUG_CHECK and TPUSIM_DEBUG_LOG
(backend/debug.py: debug mode's NaN/Inf check and per-op log), TPUSIM_RANKS and
TPUSIM_HANG_TIMEOUT_S (backend/distributed/), TPUSIM_DUMP_STABLEHLO (backend/compile.py).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import warnings
from dataclasses import dataclass

from tpusim import eager
from tpusim.errors import TpusimError
from tpusim.spec import ChipSpec, default_chip, load_chip

F64_POLICIES = ("warn", "error", "allow")
TARGETS = ("sim", "pjrt")                  # backend/targets/: what computes op values
MAX_DEVICES = 64                           # the shim's limit (backend/csrc: kMaxDevices)
CONFIG_ENV = "TPUSIM_DEVICE_CONFIG"
_ON, _OFF = ("on", "1", "true"), ("off", "0", "false")


@dataclass(frozen=True)
class DeviceConfig:
    """What the tpu device simulates and how it computes. ``None`` fields take the chip's values."""

    chip: ChipSpec                         # the chip simulated (tpusim.spec), not its name
    numerics: bool = True                  # False: shape-only mode (no host memory; values unreadable)
    f64: str = "warn"                      # float64/complex policy (backend/policy.py): F64_POLICIES
    device_count: int | None = None        # devices tpu:0..N-1 in this process; None: chips per host
    hbm_bytes: int | None = None           # HBM capacity per device; None: the chip's; 0: unlimited
    target: str = "sim"                    # what computes op values: TARGETS
    eager_mode: str | None = None          # the eager mode to start in; None: as tpusim/eager.py has it

    def __post_init__(self) -> None:
        if not isinstance(self.chip, ChipSpec):
            raise TpusimError(f"DeviceConfig.chip={self.chip!r}; accepted: a tpusim.spec.ChipSpec "
                              f"(tpusim.spec.load_chip(name or path))")
        if self.device_count is None:
            object.__setattr__(self, "device_count", self.chip.chips_per_host)
        if self.hbm_bytes is None:
            object.__setattr__(self, "hbm_bytes", self.chip.hbm_bytes)
        checks = (("numerics", isinstance(self.numerics, bool), "True or False"),
                  ("f64", self.f64 in F64_POLICIES, ", ".join(F64_POLICIES)),
                  ("device_count", _whole(self.device_count) and 1 <= self.device_count <= MAX_DEVICES,
                   f"1..{MAX_DEVICES}"),
                  ("hbm_bytes", _whole(self.hbm_bytes) and self.hbm_bytes >= 0, "bytes >= 0 (0: unlimited)"),
                  ("target", self.target in TARGETS, ", ".join(TARGETS)))
        for name, ok, accepted in checks:
            if not ok:
                raise TpusimError(f"DeviceConfig.{name}={getattr(self, name)!r}; accepted: {accepted}")

    def to_json(self) -> str:
        """This config as JSON (the chip with every field), for ``from_json`` in another process."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> DeviceConfig:
        data = json.loads(text)
        chip = {k: tuple(v) if isinstance(v, list) else v for k, v in data.pop("chip").items()}
        return cls(chip=ChipSpec(**chip), **data)

    def env(self) -> dict[str, str]:
        """The environment that gives a worker process this config (read by its ``load_config``)."""
        return {CONFIG_ENV: self.to_json()}


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _raw(name: str) -> str | None:
    raw = os.environ.get(name, "").strip()
    return raw or None


def _choice(name: str, default: str, accepted: tuple[str, ...], shown: str = "") -> str:
    raw = _raw(name)
    value = raw.lower() if raw else default
    if value not in accepted:
        raise TpusimError(f"{name}={raw!r}; accepted: {shown or ', '.join(accepted)}")
    return value


def _count(name: str, low: int, high: int | None, accepted: str) -> int | None:
    """A whole number from ``name`` (float notation allowed: 16e9), None when unset."""
    raw = _raw(name)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value == int(value) and value >= low and (high is None or value <= high)):
        raise TpusimError(f"{name}={raw!r}; accepted: {accepted}")
    return int(value)


def _chip(name: str) -> ChipSpec:
    raw = _raw(name)
    if raw is None:
        return default_chip()
    try:
        return load_chip(raw)
    except TpusimError as err:
        raise TpusimError(f"{name}={raw!r}: {err}") from None


def load_config(**given: object) -> DeviceConfig:
    """The config the TPUSIM_* variables describe (see the module docstring); the chip's numbers come
    from its ChipSpec (tpusim.spec). ``given`` fields (``DeviceConfig`` names) are taken as they are and
    their variables are not read: ``load_config(chip=spec, numerics=False)`` keeps, say, TPUSIM_F64."""
    serialised = _raw(CONFIG_ENV)
    if serialised is not None:
        try:
            return dataclasses.replace(DeviceConfig.from_json(serialised), **given)
        except (ValueError, TypeError, KeyError, AttributeError, TpusimError) as err:
            raise TpusimError(f"{CONFIG_ENV}={serialised[:80]!r}...: not a DeviceConfig ({err}); tpusim sets "
                              f"it for the processes it starts, unset it to use the other TPUSIM_* variables") from None
    readers = {
        "chip": lambda: _chip("TPUSIM_CHIP"),
        "numerics": lambda: _choice("TPUSIM_NUMERICS", "on", _ON + _OFF, "on, off") in _ON,
        "f64": lambda: _choice("TPUSIM_F64", "warn", F64_POLICIES),
        "device_count": lambda: _count("TPUSIM_DEVICES", 1, MAX_DEVICES, f"a whole number 1..{MAX_DEVICES}"),
        "hbm_bytes": lambda: _count("TPUSIM_HBM_BYTES", 0, None,
                                    "a whole number of bytes >= 0, e.g. 16e9 (0: unlimited)"),
        "target": lambda: _choice("TPUSIM_TARGET", "sim", TARGETS),
    }
    fields = {name: given[name] if name in given else read() for name, read in readers.items()}
    if fields["target"] == "pjrt" and _raw("TPUSIM_PJRT_MODE") and not _raw(eager.ENV):
        warnings.warn("tpusim pjrt: TPUSIM_PJRT_MODE is gone and ignored; the target follows the eager mode "
                      f"({eager.ENV}=debug|strict|fused)", RuntimeWarning, stacklevel=2)
    return DeviceConfig(**{**given, **fields})
