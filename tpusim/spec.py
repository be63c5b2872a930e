"""Chip generations as data: ``topologies/chips/<gen>.toml`` -> frozen ``ChipSpec``.

Adding a chip generation = adding one TOML file; nothing in code names a bandwidth.
Every value in a TOML file carries its public source (or is marked an estimate with
its reasoning); see topologies/README.md for the file format.
"""

import dataclasses
import functools
import math
import os
import tomllib
import typing
from dataclasses import dataclass
from pathlib import Path

from tpusim.errors import TpusimError


@dataclass(frozen=True)
class ChipSpec:
    """One TPU chip generation. Units are in the field names; rates are per chip unless named per link."""

    name: str                            # short id used on the command line: "v5p"
    display_name: str                    # "TPU v5p"
    # Compute: TensorCores, MXUs, VPU
    tensorcores_per_chip: int
    mxus_per_tensorcore: int
    mxu_size: int                        # an MXU is mxu_size x mxu_size MACs (128 or 256)
    clock_hz: float
    peak_bf16_flops_per_s: float
    peak_int8_flops_per_s: float         # int8 ops/s (or fp8 where that is what the chip has)
    peak_fp8_flops_per_s: float
    peak_f32_flops_per_s: float          # f32 matmul at full precision (multi-pass on the bf16 MXU)
    vpu_flops_per_s: float               # elementwise f32 throughput of the VPUs, whole chip
    transcendentals_per_s: float         # exp/log/tanh... per second, whole chip
    # Memory
    hbm_bytes: int
    hbm_bytes_per_s: float
    vmem_bytes: int                      # on-chip vector memory per TensorCore
    # SparseCores (0 where the chip has none)
    sparsecores_per_chip: int
    sparsecore_tiles: int
    sparsecore_simd_width: int
    sparsecore_gather_bytes_per_s: float  # embedding-lookup throughput of all SparseCores of a chip
    # ICI torus
    ici_ports_per_chip: int
    ici_link_bytes_per_s: float          # one way, one link
    ici_hop_latency_ns: float
    torus_dims: int                      # 2 or 3
    wrap_rule: str                       # "cube" (v4/v5p/v7: wraps on whole cubes) or "full_axis"
    wrap_cube_size: int                  # "cube": cube edge (4); "full_axis": axis length that wraps (16)
    twisted_tori: bool                   # k x k x 2k and k x 2k x 2k shapes may be twisted
    max_slice_shape: tuple[int, ...]     # largest single ICI slice
    # Hosts and networks outside the slice
    chips_per_host: int
    dcn_bytes_per_s: float               # per chip
    dcn_latency_ns: float
    pcie_bytes_per_s: float              # host <-> one chip, one way
    # Software costs the simulator needs (all estimates where no public number exists)
    kernel_launch_ns: float              # fixed cost of issuing one kernel on a TensorCore
    host_dispatch_ns: float              # host-side cost of dispatching one eager op
    compile_s: float                     # compiling one fused region (first sight)
    collective_overhead_ns: float        # fixed cost of starting one collective

    @property
    def mxus_per_chip(self) -> int:
        return self.tensorcores_per_chip * self.mxus_per_tensorcore


# --------------------------------------------------------------------------- loading

ENV_TOPOLOGIES = "TPUSIM_TOPOLOGIES"
ESTIMATE_PREFIX = "estimate: "

# Which chip a topology string gets when the user names none. 1d -> v5e: a 1-D ring is one row of a
# 2-D torus, so it needs a 2-D generation (4 ports, "full_axis" wrap), and v5e is the small, cheap
# 2-D chip people reach for in single-host experiments. 2d -> v6e (current 2-D generation),
# 3d -> v5p (the 3-D generation with full public documentation; v7 numbers are partly estimates).
DEFAULT_CHIP_FOR_DIMS: dict[int, str] = {1: "v5e", 2: "v6e", 3: "v5p"}

WRAP_RULES = ("cube", "full_axis")
_PLAIN_STRING_KEYS = ("name", "display_name")          # written as plain strings, no source table
_ZERO_ALLOWED = ("sparsecores_per_chip", "sparsecore_tiles", "sparsecore_simd_width",
                 "sparsecore_gather_bytes_per_s")      # 0 = the chip has no SparseCores
_TABLE_KEYS = ("value", "source", "estimate", "alternatives")


def topologies_dir() -> Path:
    """topologies/ next to the tpusim package, or $TPUSIM_TOPOLOGIES (to try edited data without a copy)."""
    override = os.environ.get(ENV_TOPOLOGIES)
    if override:
        return Path(override).expanduser()
    return Path(__file__).resolve().parents[1] / "topologies"


def chips_dir() -> Path:
    """Where the chip generation files live: one <name>.toml per generation."""
    return topologies_dir() / "chips"


def available_chips() -> list[str]:
    """Every chip file found, by name, sorted; a new TOML file shows up here with no code change."""
    folder = chips_dir()
    if not folder.is_dir():
        return []
    return sorted(path.stem for path in folder.glob("*.toml"))


def load_chip(name_or_path: str | os.PathLike) -> ChipSpec:
    """A chip by name ("v5p", case-insensitive) or by the path of a TOML file; loads are cached."""
    return _load_file(str(_resolve(name_or_path)))[0]


def chip_sources(name_or_path: str | os.PathLike) -> dict[str, str]:
    """field -> where its value comes from (name/display_name have none); estimates start with
    ``ESTIMATE_PREFIX`` and give the reasoning, so reports can say which numbers are guesses."""
    return dict(_load_file(str(_resolve(name_or_path)))[1])


def is_estimate(source_text: str) -> bool:
    """True for a chip_sources() entry that is reasoning, not a published figure."""
    return source_text.startswith(ESTIMATE_PREFIX)


def _resolve(name_or_path: str | os.PathLike) -> Path:
    text = os.fspath(name_or_path)
    looks_like_path = isinstance(name_or_path, os.PathLike) or text.endswith(".toml") or os.sep in text
    if looks_like_path:
        path = Path(text).expanduser()
        if not path.is_file():
            raise TpusimError(f"chip file {text} does not exist")
        return path.resolve()
    name = text.strip().lower()
    path = chips_dir() / f"{name}.toml"
    if not path.is_file():
        known = available_chips()
        if not known:
            raise TpusimError(f"no chip files found in {chips_dir()} (set {ENV_TOPOLOGIES} to the "
                              f"topologies/ folder that holds chips/*.toml)")
        raise TpusimError(f"unknown chip {text!r}; available chips: {', '.join(known)} "
                          f"(or give the path of a .toml file)")
    return path.resolve()


@functools.cache
def _load_file(path: str) -> tuple[ChipSpec, dict[str, str]]:
    """Parse and check one chip file; every problem is one TpusimError line naming the file and key."""
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except tomllib.TOMLDecodeError as error:
        raise TpusimError(f"{path}: not valid TOML: {error}") from None
    except OSError as error:
        raise TpusimError(f"{path}: cannot read: {error.strerror}") from None

    accepted = [field.name for field in dataclasses.fields(ChipSpec)]
    unknown = [key for key in data if key not in accepted]
    if unknown:
        raise TpusimError(f"{path}: unknown key {unknown[0]!r}; accepted keys: {', '.join(accepted)}")
    missing = [key for key in accepted if key not in data]
    if missing:
        raise TpusimError(f"{path}: missing key {missing[0]!r}; a chip file needs every one of: "
                          f"{', '.join(accepted)}")

    hints = typing.get_type_hints(ChipSpec)
    values: dict[str, object] = {}
    sources: dict[str, str] = {}
    for key in accepted:
        if key in _PLAIN_STRING_KEYS:
            values[key] = _plain_string(path, key, data[key])
            continue
        raw, sources[key] = _table(path, key, data[key])
        values[key] = _convert(path, key, raw, hints[key])

    stem = Path(path).stem
    if values["name"] != stem:
        raise TpusimError(f"{path}: name = {values['name']!r} but the file is {stem}.toml; "
                          f"the name must match the file name")
    _check_consistency(path, values)
    return ChipSpec(**values), sources


def _plain_string(path: str, key: str, raw: object) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise TpusimError(f"{path}: {key} must be a non-empty string, e.g. {key} = \"v5p\"")
    return raw.strip()


def _table(path: str, key: str, raw: object) -> tuple[object, str]:
    """[key] with value and exactly one of source / estimate (+ optional alternatives)."""
    if not isinstance(raw, dict):
        raise TpusimError(f"{path}: {key} must be a table [{key}] with 'value' and 'source' or "
                          f"'estimate', not a bare value")
    extra = [name for name in raw if name not in _TABLE_KEYS]
    if extra:
        raise TpusimError(f"{path}: [{key}] has unknown key {extra[0]!r}; accepted: {', '.join(_TABLE_KEYS)}")
    if "value" not in raw:
        raise TpusimError(f"{path}: [{key}] has no 'value'")
    has_source, has_estimate = "source" in raw, "estimate" in raw
    if has_source == has_estimate:
        which = "both" if has_source else "neither"
        raise TpusimError(f"{path}: [{key}] has {which} of 'source' and 'estimate'; give exactly one: "
                          f"source = where the public number is, or estimate = the reasoning behind it")
    text = raw["source"] if has_source else raw["estimate"]
    if not isinstance(text, str) or not text.strip():
        raise TpusimError(f"{path}: [{key}] {'source' if has_source else 'estimate'} must be non-empty text")
    if "alternatives" in raw and not isinstance(raw["alternatives"], str):
        raise TpusimError(f"{path}: [{key}] alternatives must be text")
    return raw["value"], text.strip() if has_source else ESTIMATE_PREFIX + text.strip()


def _convert(path: str, key: str, raw: object, kind: object) -> object:
    """TOML value -> the field's type, with the checks a simulator input needs (finite, > 0)."""
    where = f"{path}: [{key}] value"
    if kind is bool:
        if not isinstance(raw, bool):
            raise TpusimError(f"{where} must be true or false, not {raw!r}")
        return raw
    if kind is str:
        if not isinstance(raw, str):
            raise TpusimError(f"{where} must be a string, not {raw!r}")
        return raw
    if typing.get_origin(kind) is tuple:
        if not isinstance(raw, list) or not raw:
            raise TpusimError(f"{where} must be a list of axis lengths, e.g. [16, 16, 24], not {raw!r}")
        return tuple(_number(where, key, item, int) for item in raw)
    return _number(where, key, raw, kind)


def _number(where: str, key: str, raw: object, kind: type) -> int | float:
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise TpusimError(f"{where} must be a number, not {raw!r}")
    if not math.isfinite(raw):
        raise TpusimError(f"{where} must be finite, not {raw!r}")
    zero_ok = key in _ZERO_ALLOWED
    if raw < 0 or (raw == 0 and not zero_ok):
        what = "a bandwidth" if key.endswith("bytes_per_s") else "it"
        bound = ">= 0" if zero_ok else "> 0"
        raise TpusimError(f"{where} is {raw:g}: must be {bound} ({what} cannot be negative"
                          f"{'' if zero_ok else ' or zero'})")
    if kind is int:
        if float(raw) != int(raw):
            raise TpusimError(f"{where} must be a whole number, not {raw!r}")
        return int(raw)
    return float(raw)


def _check_consistency(path: str, values: dict[str, object]) -> None:
    """Cross-field rules: a wrong combination would silently mis-shape the simulated torus."""
    if values["wrap_rule"] not in WRAP_RULES:
        raise TpusimError(f"{path}: [wrap_rule] value is {values['wrap_rule']!r}; accepted: "
                          f"{', '.join(repr(rule) for rule in WRAP_RULES)}")
    if values["torus_dims"] not in (2, 3):
        raise TpusimError(f"{path}: [torus_dims] value is {values['torus_dims']}; accepted: 2, 3")
    if len(values["max_slice_shape"]) != values["torus_dims"]:
        raise TpusimError(f"{path}: [max_slice_shape] has {len(values['max_slice_shape'])} axes but "
                          f"torus_dims is {values['torus_dims']}")
    sparse = [key for key in _ZERO_ALLOWED if values[key] == 0]
    if sparse and len(sparse) != len(_ZERO_ALLOWED):
        raise TpusimError(f"{path}: [{sparse[0]}] is 0 but other SparseCore fields are not; a chip "
                          f"without SparseCores has 0 in all of: {', '.join(_ZERO_ALLOWED)}")
