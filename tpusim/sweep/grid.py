"""The grid a sweep prices: chips x topologies x slices x eager modes x placements, from flags or a TOML file.

Why its own module: the command line, the grid file and the Python API all build the same ``Grid``, and
the points it expands to are what Dask tasks are made of (one ``Point`` = one task). Adding an axis = one
field here, one flag in commands/sweep.py, one argument to ``price_point``.
"""

from __future__ import annotations

import itertools
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path

from tpusim.errors import TpusimError

DEFAULT_PLACEMENT = "default"   # the recorded mesh's default mapping (no --placement)


@dataclass(frozen=True)
class Point:
    """One configuration to price: a task of the sweep and a row of its table."""

    chip: str
    topology: str
    slices: int
    mode: str
    placement: str = DEFAULT_PLACEMENT
    calibrated: bool = True       # the chip generation's calibration applied (False: the datasheet chip)


@dataclass(frozen=True)
class Grid:
    """Lists per axis; the sweep prices their product."""

    chips: tuple[str, ...]
    topologies: tuple[str, ...]
    modes: tuple[str, ...] = ("strict",)
    slices: tuple[int, ...] = (1,)
    placements: tuple[str, ...] = (DEFAULT_PLACEMENT,)
    calibrations: tuple[bool, ...] = (True,)     # --no-calibration: (False,)

    def __post_init__(self) -> None:
        from tpusim.eager.modes import resolve_modes
        from tpusim.slice.topology import parse_slices

        for f in fields(self):
            if not getattr(self, f.name):
                raise TpusimError(f"the sweep grid needs at least one value for {f.name}")
        object.__setattr__(self, "modes", tuple(dict.fromkeys(m for text in self.modes
                                                              for m in resolve_modes(text))))
        object.__setattr__(self, "slices", tuple(parse_slices(s) for s in self.slices))

    def points(self) -> list[Point]:
        return [Point(chip, topology, slices, mode, placement, calibrated) for chip, topology, slices, mode, placement,
                calibrated in itertools.product(self.chips, self.topologies, self.slices, self.modes, self.placements,
                                                self.calibrations)]


def split_list(text: str | None) -> tuple[str, ...]:
    """``v5p,v6e`` -> ("v5p", "v6e"); placements use ``;`` between them (a placement has commas inside)."""
    if text is None:
        return ()
    sep = ";" if "=" in text else ","
    return tuple(part.strip() for part in text.split(sep) if part.strip())


GRID_KEYS = {"chip": "chips", "topology": "topologies", "mode": "modes", "slices": "slices",
             "placement": "placements"}


def load_grid_file(path: str | Path) -> dict[str, tuple]:
    """A TOML grid file, e.g. ``chip = ["v5p", "v6e"]`` / ``topology = ["2d:4x4"]`` / ``slices = [1, 2]``:
    axis name -> values (plural names accepted too); a ``[script_args]`` table (``batch-size = [8, 16]``)
    comes back as ``script_args``: ((name, values), ...), and ``tokens_per_step`` as a 1-tuple."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TpusimError(f"--grid {str(path)!r}: no such file") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise TpusimError(f"--grid {str(path)!r}: not a TOML grid file ({error})") from None
    found: dict[str, tuple] = {}
    for key, value in data.items():
        if key in SCRIPT_KEYS:
            found[key] = _script_key(path, key, value)
            continue
        axis = GRID_KEYS.get(key, key if key in GRID_KEYS.values() else None)
        if axis is None:
            raise TpusimError(f"--grid {str(path)!r}: unknown key {key!r}; accepted: "
                              f"{', '.join([*GRID_KEYS, *SCRIPT_KEYS])}")
        values = value if isinstance(value, list) else [value]
        if not values or not all(isinstance(v, str | int) and not isinstance(v, bool) for v in values):
            raise TpusimError(f"--grid {str(path)!r}: {key} must be a list of names or numbers, not {value!r}")
        if axis != "slices" and not all(isinstance(v, str) for v in values):   # `topology = 5`: no slice (W02)
            raise TpusimError(f"--grid {str(path)!r}: {key} must be a list of names (text in quotes), not {value!r}")
        found[axis] = tuple(values)
    return found


SCRIPT_KEYS = ("script_args", "tokens_per_step")    # the script-argument axis (script_args.py), not Grid's


def _script_key(path: str | Path, key: str, value: object) -> tuple:
    if key == "tokens_per_step":
        if not isinstance(value, str | int) or isinstance(value, bool):
            raise TpusimError(f"--grid {str(path)!r}: tokens_per_step is a number or e.g. \"batch-size*seq-len\"")
        return (value,)
    if not isinstance(value, dict):
        raise TpusimError(f"--grid {str(path)!r}: script_args is a table, e.g. [script_args] / batch-size = [8, 16]")
    return tuple(value.items())
