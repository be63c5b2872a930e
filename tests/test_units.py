"""Byte sizes as users type them: decimal kB/MB/GB, binary KiB/MiB/GiB, plain numbers."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tpusim.errors import TpusimError
from tpusim.units import format_bytes, parse_bytes


@pytest.mark.parametrize("text, expected", [
    ("4096", 4096), ("34MB", 34_000_000), ("1GiB", 2**30), ("1.5 KiB", 1536), ("2gb", 2_000_000_000),
])
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "0", "-5", "1.5", "ten", "5 parsecs", "1e-4kB"])
def test_parse_bytes_rejects(text):
    with pytest.raises(TpusimError):
        parse_bytes(text)


@given(st.integers(min_value=1, max_value=2**50))
def test_plain_integers_round_trip(n):
    assert parse_bytes(str(n)) == n


def test_format_bytes_uses_binary_units():
    assert format_bytes(1536) == "1.5 KiB" and format_bytes(2**30) == "1 GiB" and format_bytes(10) == "10 B"


def test_format_bytes_never_prints_an_exponent():
    # Issue 31: 1023.5 MiB printed as "1.02e+03 MiB".
    sizes = [1000, 1023.5 * 2**20, 1000 * 2**30, 3 * 2**50, *(2.0**k for k in range(0, 60))]
    assert not [n for n in sizes if "e" in format_bytes(n)]
    assert format_bytes(1023.5 * 2**20) == "1 GiB" and format_bytes(1000) == "0.977 KiB"
