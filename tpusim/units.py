"""Parsing and printing of byte sizes, bandwidths and durations for humans."""

import re

from tpusim.errors import TpusimError

_SIZE_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_bytes(text: str) -> int:
    """Parse '34MB', '1GiB', '4096' into a positive byte count (decimal kB/MB/GB, binary KiB/MiB/GiB)."""
    match = _SIZE_RE.match(str(text))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _SIZE_UNITS:
        raise TpusimError(
            f"cannot read size {text!r}: use a number of bytes with an optional unit "
            f"(B, kB, MB, GB, TB, KiB, MiB, GiB, TiB), e.g. 34MB, 1GiB, 4096"
        )
    value = float(match.group(1)) * _SIZE_UNITS[unit]
    if value <= 0 or value != int(value):
        raise TpusimError(f"size {text!r} must be a positive whole number of bytes")
    return int(value)


def format_bytes(n: float) -> str:
    """1536 -> '1.5 KiB' (binary units, as memory sizes are usually quoted)."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def format_rate(bytes_per_s: float) -> str:
    """Bandwidth in decimal GB/s or TB/s, as TPU documentation quotes it."""
    if bytes_per_s >= 1e12:
        return f"{bytes_per_s / 1e12:.3g} TB/s"
    return f"{bytes_per_s / 1e9:.3g} GB/s"


def format_flops(flops_per_s: float) -> str:
    return f"{flops_per_s / 1e12:.4g} TFLOP/s"


def format_seconds(seconds: float) -> str:
    """Pick s / ms / us / ns so the number has a readable magnitude."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.4g} {unit}"
    return f"{seconds / 1e-9:.4g} ns"
