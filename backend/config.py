"""Environment settings of the tpu device, read once at import.

TPUSIM_CHIP        chip generation simulated (a topologies/chips/*.toml name), default "v5p":
                   gives the HBM capacity per device and the number of devices (chips per host)
TPUSIM_DEVICES     number of tpu devices in this process (default: the chip's chips per host)
TPUSIM_HBM_BYTES   HBM capacity per device in bytes (default: the chip's; 0 = unlimited)
TPUSIM_NUMERICS    "on" (default) or "off": shape-only mode, no host memory, values unreadable
TPUSIM_F64         "warn" (default): float64/complex ops run on the host with a warning once
                   per op; "error": they raise; "allow": silent

Read elsewhere, next to what they drive: TPUSIM_EAGER_MODE (tpusim/eager.py: debug, strict or
fused), TPUSIM_DEBUG_CHECK and TPUSIM_DEBUG_LOG (backend/debug.py: debug mode's NaN/Inf check
and per-op log).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from tpusim.errors import TpusimError

F64_POLICIES = ("warn", "error", "allow")


@dataclass(frozen=True)
class DeviceConfig:
    chip: str
    chip_display: str
    device_count: int
    hbm_bytes: int
    numerics: bool
    f64: str


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(float(raw))
    except ValueError:
        raise TpusimError(f"{name}={raw!r} is not a number") from None


def load_config() -> DeviceConfig:
    """Read the TPUSIM_* variables; the chip's numbers come from its ChipSpec (tpusim.spec)."""
    from tpusim.spec import load_chip

    chip_name = os.environ.get("TPUSIM_CHIP", "v5p").strip() or "v5p"
    spec = load_chip(chip_name)
    numerics = os.environ.get("TPUSIM_NUMERICS", "on").strip().lower()
    if numerics not in ("on", "off", "1", "0", "true", "false"):
        raise TpusimError(f"TPUSIM_NUMERICS={numerics!r}; accepted: on, off")
    f64 = os.environ.get("TPUSIM_F64", "warn").strip().lower() or "warn"
    if f64 not in F64_POLICIES:
        raise TpusimError(f"TPUSIM_F64={f64!r}; accepted: {', '.join(F64_POLICIES)}")
    devices = _env_int("TPUSIM_DEVICES", spec.chips_per_host)
    if not 1 <= devices <= 64:
        raise TpusimError(f"TPUSIM_DEVICES={devices}; accepted: 1..64")
    return DeviceConfig(
        chip=spec.name,
        chip_display=spec.display_name,
        device_count=devices,
        hbm_bytes=_env_int("TPUSIM_HBM_BYTES", spec.hbm_bytes),
        numerics=numerics in ("on", "1", "true"),
        f64=f64,
    )
