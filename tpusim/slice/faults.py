"""Faults on the slice: ``--fail-links`` / ``--fail-chips`` / ``--fault-seed`` -> a faulted ``Slice``.

A slice with faults is the same torus with some links or chips gone, like a road network with a
few bridges closed: traffic still gets through, on detours that share other roads. What a fault
does to routes and collectives lives with them (``tpusim.slice.topology`` routes around failures,
``tpusim.network.collectives`` simulates the lines a detour disturbs in full); this module only turns
what the user typed into ``topology.Faults`` on the slice, and says what is wrong when it cannot.

Accepted forms (``parse_links``, ``parse_chips``):

- ``--fail-links "x+@(0,0,0)"``: the link leaving chip (0,0,0) in the +x direction; a list is
  separated by spaces, commas or semicolons (``"x+@(0,0,0) y-@(1,2,3)"``). ``y-@(1,2,3)`` is the
  link between (1,2,3) and its -y neighbour, the same link as ``y+@(1,1,3)``. On a slice shorter
  than the chip's torus (2d:4x4 on v5p is 4x4x1) a coordinate may leave out its trailing axes of
  length 1.
- ``--fail-chips "(1,1,1),(2,0,3)"``: chips by coordinate (or ``--fail-chips 2``).
- a count ``N`` instead of a list: N distinct links (chips) drawn at random by ``--fault-seed``
  (default 0, so a run is reproducible; the seed is recorded in the report).

Every bad spec is one ``TpusimError`` (exit code 2): an unknown axis, a chip outside the slice, a
link that does not exist (past the end of an axis that does not wrap, or along an axis of
length 1), a link or chip listed twice, more failures than the slice has links (chips), or a
seed without a count.

How much a fault slows a run is the report's business: ``tpusim.report.faults``.
"""

from __future__ import annotations

import dataclasses
import random
import re

from tpusim.errors import TpusimError, plain_text, shown
from tpusim.slice.topology import NO_FAULTS, Coord, Faults, LinkKey, Slice, format_coord

MAX_SPEC_CHARS = 4096     # a longer --fail-links / --fail-chips value is refused before it is parsed
MAX_COUNT_DIGITS = 9      # a count with more digits is more failures than any slice has links

_LINK_ACCEPTED = ("accepted: a count N (drawn at random with --fault-seed), or links AXIS+@(COORD) / "
                  "AXIS-@(COORD) separated by spaces or commas, e.g. 'x+@(0,0,0) y-@(1,2,3)'")
_CHIP_ACCEPTED = ("accepted: a count N (drawn at random with --fault-seed), or chip coordinates separated by "
                  "spaces or commas, e.g. '(1,1,1) (2,0,3)'")
_SEP = r"[\s,;]*"
_LINK_RE = re.compile(r"([A-Za-z]+)\s*([+-])\s*@\s*\(([^()]*)\)", re.ASCII)
_CHIP_RE = re.compile(r"\(([^()]*)\)", re.ASCII)
_COUNT_RE = re.compile(r"[0-9]+", re.ASCII)


def add_fault_arguments(parser) -> None:
    """The three flags, for ``tpusim run``, ``collective`` and ``compare``."""
    parser.add_argument("--fail-links", metavar="LINKS",
                        help="remove ICI links: 'x+@(0,0,0) y-@(1,2,3)' (the link leaving chip (0,0,0) in the +x "
                             "direction, ...), or a count N drawn at random with --fault-seed")
    parser.add_argument("--fail-chips", metavar="CHIPS",
                        help="remove chips (and their links): '(1,1,1) (2,0,3)', or a count N drawn at random")
    parser.add_argument("--fault-seed", metavar="SEED",
                        help="seed that draws --fail-links N / --fail-chips N (default 0: reproducible)")


def fault_args(args) -> tuple[str | None, str | None, str | None]:
    """(--fail-links, --fail-chips, --fault-seed) of parsed arguments, for ``apply_faults(slice_, *...)``."""
    return args.fail_links, args.fail_chips, args.fault_seed


def apply_faults(slice_: Slice, fail_links: str | int | None = None, fail_chips: str | int | None = None,
                 seed: str | int | None = None) -> Slice:
    """``slice_`` with the failures the three flags describe (``slice_`` itself when there are none)."""
    links, chips = _given(fail_links), _given(fail_chips)
    if seed is not None and seed != "":
        seed = _seed(seed)
        if not (_is_count(links) or _is_count(chips)):
            raise TpusimError(f"--fault-seed {seed} chooses the failures of a count (--fail-links N or "
                              f"--fail-chips N); with lists or no failures it has nothing to choose")
    else:
        seed = None
    if links is None and chips is None:
        return slice_
    rng = random.Random(0 if seed is None else seed)
    drawn = _is_count(links) or _is_count(chips)
    failed_chips = parse_chips(slice_, chips, rng) if chips is not None else frozenset()
    failed_links = parse_links(slice_, links, rng) if links is not None else frozenset()
    faults = Faults(failed_links, failed_chips, (0 if seed is None else seed) if drawn else None)
    if not faults:
        return slice_.healthy
    return dataclasses.replace(slice_, faults=faults)


def _given(value: str | int | None) -> str | int | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    return value


def _is_count(value: str | int | None) -> bool:
    if isinstance(value, int) and not isinstance(value, bool):
        return True
    return isinstance(value, str) and _COUNT_RE.fullmatch(value.strip()) is not None


def _seed(value: str | int) -> int:
    accepted = "accepted: a whole number from 0 to 2**32 - 1"
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        word = plain_text(value, "--fault-seed", accepted, max_length=32).strip()
        if not re.fullmatch(r"[0-9]{1,10}", word, re.ASCII):
            raise TpusimError(f"--fault-seed {shown(value)} is not a whole number; {accepted}")
        number = int(word)
    if not 0 <= number < 2**32:
        raise TpusimError(f"--fault-seed {number} is out of range; {accepted}")
    return number


def _count(value: str | int, flag: str, limit: int, what: str, slice_: Slice, accepted: str) -> int:
    text = str(value).strip()
    if len(text) > MAX_COUNT_DIGITS:
        raise TpusimError(f"{flag} {shown(value)}: more failures than slice {slice_.spec} has {what} "
                          f"({limit}); {accepted}")
    n = int(text)
    if n > limit:
        raise TpusimError(f"{flag} {n}: more failures than slice {slice_.spec} has {what} ({limit})")
    return n


def _coord(slice_: Slice, text: str, item: str, flag: str) -> Coord:
    """'0, 1,2' -> (0, 1, 2), checked against the slice; trailing axes of length 1 may be left out."""
    parts = [p.strip() for p in text.split(",")]
    if not all(re.fullmatch(r"[0-9]{1,6}", p, re.ASCII) for p in parts):
        raise TpusimError(f"{flag} item {shown(item)}: a coordinate is {slice_.ndims} whole numbers in "
                          f"parentheses, e.g. ({','.join('0' * slice_.ndims)})")
    coord = [int(p) for p in parts]
    if len(coord) < slice_.ndims and all(n == 1 for n in slice_.dims[len(coord):]):
        coord += [0] * (slice_.ndims - len(coord))
    dims = "x".join(map(str, slice_.dims))
    if len(coord) != slice_.ndims:
        raise TpusimError(f"{flag} item {shown(item)}: slice {slice_.spec} has {slice_.ndims} axes, so a chip "
                          f"is {slice_.ndims} numbers, not {len(coord)}")
    if any(not 0 <= c < n for c, n in zip(coord, slice_.dims, strict=True)):
        raise TpusimError(f"{flag} item {shown(item)}: chip {format_coord(coord)} is outside slice {slice_.spec} "
                          f"(0 <= coordinate < {dims} per axis)")
    return tuple(coord)


def _items(text: str, pattern: re.Pattern, flag: str, accepted: str) -> list[re.Match]:
    """Every match of ``pattern`` in ``text``, which must be nothing but matches and separators."""
    plain_text(text, flag, accepted, max_length=MAX_SPEC_CHARS)
    found, pos = [], 0
    while True:
        gap = re.compile(_SEP).match(text, pos)
        pos = gap.end()
        if pos == len(text):
            break
        m = pattern.match(text, pos)
        if m is None:
            rest = re.split(r"[\s;]", text[pos:], maxsplit=1)[0]
            raise TpusimError(f"{flag} {shown(text)}: cannot read {shown(rest)}; {accepted}")
        found.append(m)
        pos = m.end()
    return found


def parse_links(slice_: Slice, value: str | int, rng: random.Random | None = None) -> frozenset[LinkKey]:
    """--fail-links: a list of AXIS±@(COORD) or a count drawn with ``rng`` (module docstring)."""
    every = sorted(_all_links(slice_))
    if _is_count(value):
        n = _count(value, "--fail-links", len(every), "links", slice_, _LINK_ACCEPTED)
        return frozenset((rng or random.Random(0)).sample(every, n))
    out: dict[LinkKey, str] = {}
    names = slice_.axis_names
    for m in _items(value, _LINK_RE, "--fail-links", _LINK_ACCEPTED):
        item, axis_name, sign = m.group(0), m.group(1).lower(), m.group(2)
        if axis_name not in names:
            raise TpusimError(f"--fail-links item {shown(item)}: unknown axis {shown(m.group(1))}; slice "
                              f"{slice_.spec} has axes {', '.join(names)}")
        axis = names.index(axis_name)
        coord = _coord(slice_, m.group(3), item, "--fail-links")
        direction = 1 if sign == "+" else -1
        key = slice_.link_key(coord, axis, direction)
        if key is None:
            n = slice_.dims[axis]
            why = (f"axis {axis_name} has length 1" if n == 1 else
                   f"axis {axis_name} does not wrap in {slice_.spec}, so chip {format_coord(coord)} at its "
                   f"{'end' if direction > 0 else 'start'} has no {axis_name}{sign} link")
            raise TpusimError(f"--fail-links item {shown(item)}: no such link ({why})")
        if key in out:
            same = "" if out[key] == item else f" ({out[key]} names the same link)"
            raise TpusimError(f"--fail-links item {shown(item)} is listed twice{same}")
        out[key] = item
    return frozenset(out)


def parse_chips(slice_: Slice, value: str | int, rng: random.Random | None = None) -> frozenset[Coord]:
    """--fail-chips: a list of (COORD) or a count drawn with ``rng`` (module docstring)."""
    if _is_count(value):
        n = _count(value, "--fail-chips", slice_.num_chips, "chips", slice_, _CHIP_ACCEPTED)
        return frozenset((rng or random.Random(0)).sample(list(slice_.coords()), n))
    out: set[Coord] = set()
    for m in _items(value, _CHIP_RE, "--fail-chips", _CHIP_ACCEPTED):
        coord = _coord(slice_, m.group(1), m.group(0), "--fail-chips")
        if coord in out:
            raise TpusimError(f"--fail-chips item {shown(m.group(0))} is listed twice")
        out.add(coord)
    return frozenset(out)


def _all_links(slice_: Slice) -> set[LinkKey]:
    return {(c, a) for c in slice_.coords() for a in range(slice_.ndims) if slice_.link_key(c, a, 1) is not None}


def describe(slice_: Slice) -> str:
    """One line: 'failed: link x+@(0,0,0); chip (1,1,1) (62 of 64 chips, 185 of 192 links working)'."""
    f = slice_.faults
    if not f:
        return "no faults"
    parts = []
    if f.links:
        names = sorted(slice_.link_name(k) for k in f.links)
        parts.append(f"link{'s' if len(names) > 1 else ''} {' '.join(_cut(names))}")
    if f.chips:
        coords = [format_coord(c) for c in sorted(f.chips)]
        parts.append(f"chip{'s' if len(coords) > 1 else ''} {' '.join(_cut(coords))}")
    drawn = f" drawn with --fault-seed {f.seed}" if f.seed is not None else ""
    working = slice_.num_links - len(slice_.failed_links)
    return (f"failed {'; '.join(parts)}{drawn} ({slice_.num_chips - len(f.chips)} of {slice_.num_chips} chips, "
            f"{working} of {slice_.num_links} links working)")


def _cut(names: list[str], shown_max: int = 6) -> list[str]:
    return names if len(names) <= shown_max else names[:shown_max] + [f"and {len(names) - shown_max} more"]


__all__ = ["NO_FAULTS", "add_fault_arguments", "apply_faults", "describe", "fault_args", "parse_chips",
           "parse_links"]
