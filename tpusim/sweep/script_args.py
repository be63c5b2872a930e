"""The sweep axis over the script's own arguments: ``--script-arg batch-size=8,16 --script-arg seq-len=128,256``.

Why its own module: batch size and sequence length change the shapes a script records, so unlike chips or
modes they cannot be priced from one recording; each distinct combination is recorded once (record.py) and
the grid's points are priced against it. This module is only the axis: parsing, the combinations, the
argv one combination hands the script, and tokens per step (``batch-size*seq-len``) for that combination.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence

from tpusim.errors import TpusimError
from tpusim.units import ascii_whole

Combination = tuple[tuple[str, str], ...]     # ((name, value), ...) in the order the axes were given
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*\Z")
RESERVED = frozenset({"chip", "calibrated", "topology", "slices", "mode", "placement", "chips", "status", "error",
                      "pareto", "worker", "recording"})    # names the table already has a column for


def parse_script_arg(text: str) -> tuple[str, tuple[str, ...]]:
    """``batch-size=8,16,32`` -> ("batch-size", ("8", "16", "32")): the script gets ``--batch-size 8``."""
    name, sep, values = text.partition("=")
    name = name.strip().lstrip("-")
    parts = tuple(v.strip() for v in values.split(",") if v.strip())
    if not sep or not parts:
        raise TpusimError(f"--script-arg {text!r}: give NAME=VALUE[,VALUE...], e.g. batch-size=8,16,32")
    return check_name(name), parts


def check_name(name: str) -> str:
    if not _NAME.match(name):
        raise TpusimError(f"--script-arg name {name!r}: letters, digits, '-' and '_' only, e.g. batch-size")
    if name in RESERVED:
        raise TpusimError(f"--script-arg name {name!r} is a column of the sweep table already; rename the flag")
    return name


def script_axes(given: Mapping[str, Sequence[object]] | Sequence[tuple[str, Sequence[object]]],
                ) -> dict[str, tuple[str, ...]]:
    """Axes from the API / grid file (name -> values, numbers accepted), checked; duplicates kept once."""
    items = given.items() if isinstance(given, Mapping) else given
    axes: dict[str, tuple[str, ...]] = {}
    for name, values in items:
        listed = values if isinstance(values, list | tuple) else [values]
        if not listed or not all(isinstance(v, str | int | float) and not isinstance(v, bool) for v in listed):
            raise TpusimError(f"script argument {name!r}: give a list of values, not {values!r}")
        axes[check_name(str(name).lstrip("-"))] = tuple(dict.fromkeys(str(v) for v in listed))
    return axes


def combinations(axes: Mapping[str, tuple[str, ...]]) -> list[Combination]:
    """Every distinct combination of the axes' values (the recordings to make)."""
    names = list(axes)
    return [tuple(zip(names, values)) for values in itertools.product(*(axes[n] for n in names))]


def script_argv(combination: Combination) -> list[str]:
    """(("batch-size", "8"),) -> ["--batch-size", "8"]: what the script's argparse reads."""
    return [part for name, value in combination for part in (f"--{name}", value)]


def label(combination: Combination) -> str:
    """A folder-safe name for the combination's recording, e.g. ``batch-size=8,seq-len=128``."""
    return ",".join(f"{name}={re.sub(r'[^A-Za-z0-9._-]', '_', value)}" for name, value in combination) or "run"


def typed(value: str) -> int | float | str:
    """A table cell: numbers as numbers (so plots and sorting read them as such), else the text."""
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def tokens_per_step(expression: str | int | None, combination: Combination) -> int | None:
    """``batch-size*seq-len`` (or ``8192``, or ``batch-size*1024``) evaluated for one combination: tokens one
    step processes over the slice, handed to `tpusim run --tokens-per-step`."""
    if expression is None:
        return None
    values = dict(combination)
    total = 1
    for factor in str(expression).split("*"):
        factor = factor.strip().lstrip("-")
        text = values.get(factor, factor)
        if not ascii_whole(text):
            raise TpusimError(f"--tokens-per-step {expression!r}: {factor!r} is neither a whole number nor a "
                              f"--script-arg with whole-number values ({', '.join(values) or 'none given'})")
        total *= int(text)
    if total <= 0:
        raise TpusimError(f"--tokens-per-step {expression!r} is {total} for {label(combination)}; it must be > 0")
    return total
