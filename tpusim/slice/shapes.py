"""Is a topology a slice shape the chip generation is sold in? A note when it is not.

Why a note and not an error: ``3d:3x5x7`` on v5p is no slice anyone can rent, and a user who typed
it by mistake must hear so; but a what-if study (a shape Google does not offer, a custom ``--chip``
file) is still a fair question to price. So ``build_slice`` accepts the shape, and the note travels
with the Slice into ``tpusim topology``, the run summary, report.json and report.html.

The allowed shapes are data in the chip files (``[slice_shapes]``, each with its public source),
read with two rules the same files already state:

- "cube" generations (v4, v5p, v7): every axis a multiple of ``wrap_cube_size`` (whole 4x4x4 cubes
  joined by optical switches, up to the chip count ``_check_fits`` allows) is also a slice shape;
- any shape that fits on one host (at most ``chips_per_host`` chips, power-of-two axes) is a subset of
  a host's chips (``TPU_VISIBLE_DEVICES``), which is how one chip is used.

Axes are compared in any order (``4x2x2`` is ``2x2x4``: the order only names the axes). A chip file
without ``[slice_shapes]`` (a custom chip for a what-if study) gets no check. The check is a sort, a
set lookup and a modulo per axis: cheap enough for sweeps over 100,000-chip multislices.
"""

from __future__ import annotations

import math
import re

from tpusim.errors import TpusimError
from tpusim.hardware.spec import ChipSpec, chip_sources


def _key(dims: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(sorted(dims))


def _parse(shape: str) -> tuple[int, ...]:
    return tuple(int(n) for n in shape.lower().split("x"))


def _fits_one_host(dims: tuple[int, ...], chip: ChipSpec) -> bool:
    return math.prod(dims) <= chip.chips_per_host and all(n & (n - 1) == 0 for n in dims)


def _whole_cubes(dims: tuple[int, ...], chip: ChipSpec) -> bool:
    return chip.wrap_rule == "cube" and all(n % chip.wrap_cube_size == 0 for n in dims)


def is_slice_shape(dims: tuple[int, ...], chip: ChipSpec) -> bool:
    """True when ``dims`` (padded to the chip's torus dimensionality) is a shape this generation is
    offered in, or the chip file lists no shapes."""
    if not chip.slice_shapes:
        return True
    if _key(dims) in {_key(_parse(shape)) for shape in chip.slice_shapes}:
        return True
    return _fits_one_host(dims, chip) or _whole_cubes(dims, chip)


def _address(chip: ChipSpec) -> str | None:
    """The first address in the [slice_shapes] source: 'Cloud TPU v5p doc (docs.cloud.google.com/...)'."""
    try:
        source = chip_sources(chip.name).get("slice_shapes", "")
    except TpusimError:        # a chip built in code, not loaded from a file: no source to cite
        return None
    match = re.search(r"\(([a-z0-9.-]+\.[a-z]{2,}/[^\s),]*)", source)
    return f"https://{match.group(1)}" if match else None


def allowed_text(chip: ChipSpec) -> str:
    """'2x2x1, 2x2x2, 2x2x4, 2x4x4, or every axis a multiple of 4 (whole 4x4x4 cubes)'."""
    listed = ", ".join(chip.slice_shapes)
    if chip.wrap_rule == "cube":
        c = chip.wrap_cube_size
        listed += f", or every axis a multiple of {c} (whole {c}x{c}x{c} cubes)"
    return listed + "; axes in any order"


def shape_note(dims: tuple[int, ...], chip: ChipSpec) -> str | None:
    """None for a real slice shape; otherwise one line saying what is offered and where it is written."""
    if is_slice_shape(dims, chip):
        return None
    shape = "x".join(map(str, dims))
    where = _address(chip)
    return (f"{shape} is not a {chip.name} slice shape; {chip.name} slices are {allowed_text(chip)}"
            f"{f' (see {where})' if where else ''}. Priced as asked, as a what-if shape")
