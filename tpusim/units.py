"""Parsing and printing of byte sizes, bandwidths and durations for humans."""

import re
from fractions import Fraction

from tpusim.errors import TpusimError, plain_text, shown

_SIZE_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
# ASCII only ([0-9], not \d): Unicode digits are refused, not read as numbers
_SIZE_RE = re.compile(r"^ *([0-9]*)(?:\.([0-9]+))?(?:[eE]([+-]?[0-9]+))? *([a-zA-Z]*) *$")
MAX_BYTES = 2**63 - 1           # 8 EiB: what a byte count in the trace (a 64-bit integer) can hold
_MAX_DIGITS = 30                # per part of the number: more is never a size
_ACCEPTED = ("use a whole number of bytes with an optional unit (B, kB, MB, GB, TB, KiB, MiB, GiB, TiB), "
             "e.g. 34MB, 1GiB, 4096")


def parse_bytes(text: str) -> int:
    """Parse '34MB', '1GiB', '4096', '1.5KiB', '1e6' into a positive byte count (decimal kB/MB/GB,
    binary KiB/MiB/GiB); exact (no float on the way, so '9007199254740993' stays odd), at most
    ``MAX_BYTES``; anything else is a TpusimError saying what is accepted."""
    plain_text(text, "size", _ACCEPTED, max_length=64)
    match = _SIZE_RE.match(text)
    unit = match.group(4).lower() if match else None
    if match is None or unit not in _SIZE_UNITS or not (match.group(1) or match.group(2)):
        raise TpusimError(f"cannot read size {shown(text)}: {_ACCEPTED}")
    whole, fraction, exponent = match.group(1) or "0", match.group(2) or "", match.group(3) or "0"
    if max(len(whole), len(fraction), len(exponent.lstrip("+-"))) > _MAX_DIGITS or abs(int(exponent)) > _MAX_DIGITS:
        raise TpusimError(f"size {shown(text)} is out of range: at most {MAX_BYTES} bytes (8 EiB)")
    value = Fraction(int(whole + fraction), 10 ** len(fraction)) * Fraction(10) ** int(exponent) * _SIZE_UNITS[unit]
    if value > MAX_BYTES:
        raise TpusimError(f"size {shown(text)} is out of range: at most {MAX_BYTES} bytes (8 EiB)")
    if value <= 0 or value.denominator != 1:
        raise TpusimError(f"size {shown(text)} must be a positive whole number of bytes")
    return int(value)


def format_bytes(n: float) -> str:
    """1536 -> '1.5 KiB' (binary units, as memory sizes are usually quoted); from 1000 of a unit on, the next
    one (1023.5 MiB -> '0.999 GiB', never '1.02e+03 MiB')."""
    for unit, scale in (("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale * 1000 / 1024:
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


def ascii_whole(text: str) -> bool:
    """Whether ``text`` is a whole number in ASCII digits: str.isdigit() alone also takes superscripts ("²")
    and other scripts' digits, which int() then refuses or reads as something else."""
    return text.isascii() and text.isdigit()
