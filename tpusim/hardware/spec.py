"""Chip generations as data: ``topologies/chips/<gen>.toml`` -> frozen ``ChipSpec``.

Adding a chip generation = adding one TOML file; nothing in code names a bandwidth, a chip
generation or a JAX device kind. Every value in a TOML file carries its public source (or is
marked an estimate with its reasoning); see topologies/README.md for the file format.

Facts that name chips rather than measure them live in the same files: the JAX ``device_kind``
strings of a chip (``chip_for_device_kind``: "TPU v5 lite" -> v5e), and tpusim's defaults,
``default = true`` on the chip used when nothing names one (``default_chip``) and
``default_for_dims`` on the chip a topology string of that many axes gets
(``default_chip_for_dims``). Those two are choices, so they are plain keys with a comment, not
sourced tables. So are a chip's other names, ``aliases`` (the Cloud accelerator names and code names a
user types: "tpu7x", "ironwood" -> v7), which ``load_chip`` accepts as well as the file name.
"""

import dataclasses
import functools
import math
import os
import re
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
    compile_s: float                     # compiling one region (first sight): the fixed part
    collective_overhead_ns: float        # fixed cost of starting one collective
    # Names and defaults (optional in a file: a field with a default here)
    jax_device_kinds: tuple[str, ...] = ()   # what JAX's Device.device_kind says on this chip ("TPU v5 lite")
    xla_topology_name: str = ""          # the generation in libtpu's topology strings ("v5p" in "v5p:2x2x2");
                                         # "": the TPU compiler (tpusim/xla/) cannot target it
    xla_flags: str = ""                  # LIBTPU_INIT_ARGS the TPU compiler compiles with (what published runs set)
    default: bool = False                # tpusim's choice: the chip when nothing names one
    default_for_dims: tuple[int, ...] = ()   # tpusim's choice: topology strings of these many axes get it
    aliases: tuple[str, ...] = ()        # other names load_chip accepts ("tpu7x", "ironwood"), lower case
    # Devices a chip exposes to software (optional, sourced): 1, or 2 on v7 (one per TensorCore); the tpu
    # device shows each as one device with its share of the chip's HBM
    devices_per_chip: int = 1
    # Slice shapes the generation is offered in (optional, sourced; tpusim/slice/shapes.py reads them):
    # "2x2x4", axes in any order; none listed = no check (a custom chip for a what-if study)
    slice_shapes: tuple[str, ...] = ()
    # Compiling a region also costs this much per op in it (optional, sourced; 0 = compile_s flat)
    compile_per_op_s: float = 0.0

    @property
    def mxus_per_chip(self) -> int:
        return self.tensorcores_per_chip * self.mxus_per_tensorcore


# --------------------------------------------------------------------------- loading

ENV_TOPOLOGIES = "TPUSIM_TOPOLOGIES"
ESTIMATE_PREFIX = "estimate: "

TOPOLOGY_DIMS = (1, 2, 3)                              # "1d:", "2d:", "3d:" topology strings
WRAP_RULES = ("cube", "full_axis")
PLAIN_KEYS = ("name", "display_name", "default", "default_for_dims", "aliases")   # plain values, no source table
_ZERO_ALLOWED = ("sparsecores_per_chip", "sparsecore_tiles", "sparsecore_simd_width",
                 "sparsecore_gather_bytes_per_s")      # 0 = the chip has no SparseCores
_TABLE_KEYS = ("value", "source", "estimate", "alternatives")


def topologies_dir() -> Path:
    """topologies/ next to the tpusim package, or $TPUSIM_TOPOLOGIES (to try edited data without a copy)."""
    override = os.environ.get(ENV_TOPOLOGIES)
    if override:
        return Path(override).expanduser()
    return Path(__file__).resolve().parents[2] / "topologies"


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


def default_chip() -> ChipSpec:
    """The chip used when nothing names one: the chip file marked ``default = true``."""
    marked = [chip for chip in _all_chips() if chip.default]
    if len(marked) != 1:
        found = ", ".join(c.name for c in marked) or "none"
        raise TpusimError(f"exactly one chip file in {chips_dir()} must say default = true; found: {found}")
    return marked[0]


def default_chip_for_dims(ndims: int) -> ChipSpec:
    """The chip a topology string with ``ndims`` axes gets when no chip is named (its file lists ``ndims``
    in ``default_for_dims``)."""
    marked = [chip for chip in _all_chips() if ndims in chip.default_for_dims]
    if len(marked) != 1:
        found = ", ".join(c.name for c in marked) or "none"
        raise TpusimError(f"exactly one chip file in {chips_dir()} must list {ndims} in default_for_dims; "
                          f"found: {found}")
    return marked[0]


def chip_for_device_kind(device_kind: str) -> ChipSpec | None:
    """The chip whose file lists JAX's ``device_kind`` ("TPU v5 lite" -> v5e; case and spacing ignored);
    None when no chip file does (a CPU, a GPU, a TPU generation tpusim has no file for)."""
    wanted = _kind_key(device_kind)
    return next((chip for chip in _all_chips() if wanted in map(_kind_key, chip.jax_device_kinds)), None)


def _kind_key(device_kind: str) -> str:
    return " ".join(device_kind.lower().split())


def _all_chips() -> list[ChipSpec]:
    return [load_chip(name) for name in available_chips()]


def _resolve(name_or_path: str | os.PathLike) -> Path:
    """The chip file a name or path means; the file system's own errors (a name too long, a NUL byte,
    a folder without permission) become one TpusimError naming what was given."""
    try:
        return _find_chip_file(name_or_path)
    except TpusimError:
        raise
    except (OSError, ValueError, RuntimeError) as error:     # RuntimeError: "~nosuchuser/x.toml"
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        known = ", ".join(available_chips()) or "none found"
        raise TpusimError(f"chip {os.fspath(name_or_path)[:200]!r} cannot be looked up: {reason}; give a chip "
                          f"name ({known}) or the path of a .toml file") from None


def _not_a_file(path: Path) -> str:
    """Why ``path`` is no chip file, in words: a folder or a FIFO was "does not exist" (issue 44, K13, K14)."""
    if path.is_dir():
        return "is a folder; give the path of a chip's .toml file"
    if path.exists():
        return "is not a regular file (a FIFO, socket or device); give the path of a chip's .toml file"
    if path.is_symlink():
        return f"is a broken symlink (to {os.readlink(path)!r})"
    return "does not exist"


def _find_chip_file(name_or_path: str | os.PathLike) -> Path:
    text = os.fspath(name_or_path)
    looks_like_path = isinstance(name_or_path, os.PathLike) or text.endswith(".toml") or os.sep in text
    if looks_like_path:
        path = Path(text).expanduser()
        if not path.is_file():
            raise TpusimError(f"chip file {text} {_not_a_file(path)}")
        return path.resolve()
    name = text.strip().lower()
    path = chips_dir() / f"{name}.toml"
    if not path.is_file():
        named = [chip.name for chip in _all_chips() if name in chip.aliases]
        if len(named) == 1:
            return (chips_dir() / f"{named[0]}.toml").resolve()
        known = available_chips()
        if not known:
            raise TpusimError(f"no chip files found in {chips_dir()} (set {ENV_TOPOLOGIES} to the "
                              f"topologies/ folder that holds chips/*.toml)")
        aliases = sorted(a for chip in _all_chips() for a in chip.aliases)
        raise TpusimError(f"unknown chip {text!r}; available chips: {', '.join(known)} "
                          f"(also accepted: {', '.join(aliases) or 'no aliases'}; or give the path of a .toml file)")
    return path.resolve()


@functools.cache
def _load_file(path: str) -> tuple[ChipSpec, dict[str, str]]:
    """Parse and check one chip file; every problem is one TpusimError line naming the file and key."""
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except tomllib.TOMLDecodeError as error:
        raise TpusimError(f"{path}: not valid TOML: {error}") from None
    except UnicodeDecodeError as error:          # TOML is UTF-8 (issue 32, row 9: a raw UnicodeDecodeError)
        raise TpusimError(f"{path}: not UTF-8 text (byte {error.object[error.start]:#04x} at offset {error.start}); "
                          f"a chip file is TOML, which is UTF-8") from None
    except OSError as error:
        raise TpusimError(f"{path}: cannot read: {error.strerror}") from None

    fields = dataclasses.fields(ChipSpec)
    accepted = [field.name for field in fields]
    unknown = [key for key in data if key not in accepted]
    if unknown:
        raise TpusimError(f"{path}: unknown key {unknown[0]!r}; accepted keys: {', '.join(accepted)}")
    required = [field.name for field in fields if field.default is dataclasses.MISSING]
    missing = [key for key in required if key not in data]
    if missing:
        raise TpusimError(f"{path}: missing key {missing[0]!r}; a chip file needs every one of: "
                          f"{', '.join(required)}")

    hints = typing.get_type_hints(ChipSpec)
    values: dict[str, object] = {}
    sources: dict[str, str] = {}
    for key in accepted:
        if key not in data:
            continue                                   # optional: the dataclass default
        if key in PLAIN_KEYS:
            values[key] = _plain(path, key, data[key], hints[key])
            continue
        raw, sources[key] = _table(path, key, data[key])
        values[key] = _convert(path, key, raw, hints[key])

    stem = Path(path).stem
    if values["name"] != stem:
        raise TpusimError(f"{path}: name = {values['name']!r} but the file is {stem}.toml; "
                          f"the name must match the file name")
    _check_consistency(path, values)
    return ChipSpec(**values), sources


def _plain(path: str, key: str, raw: object, kind: object) -> object:
    """A plain key (no source table): a name, or one of tpusim's default choices."""
    if kind is str:
        if not isinstance(raw, str) or not raw.strip():
            raise TpusimError(f"{path}: {key} must be a non-empty string, e.g. {key} = \"v5p\"")
        return raw.strip()
    if kind is bool:
        if not isinstance(raw, bool):
            raise TpusimError(f"{path}: {key} must be true or false, not {raw!r}")
        return raw
    if typing.get_args(kind)[0] is str:                # aliases: other names of the chip
        if not isinstance(raw, list) or not all(isinstance(n, str) and n.strip() for n in raw):
            raise TpusimError(f"{path}: {key} must be a list of names, e.g. {key} = [\"ironwood\"], not {raw!r}")
        return tuple(n.strip().lower() for n in raw)
    if not isinstance(raw, list) or any(isinstance(n, bool) or n not in TOPOLOGY_DIMS for n in raw):
        raise TpusimError(f"{path}: {key} must be a list of topology dimensionalities from "
                          f"{list(TOPOLOGY_DIMS)}, e.g. {key} = [3], not {raw!r}")
    return tuple(raw)


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
    if typing.get_origin(kind) is tuple and typing.get_args(kind)[0] is str:
        if not isinstance(raw, list) or not all(isinstance(item, str) and item.strip() for item in raw):
            raise TpusimError(f"{where} must be a list of strings, e.g. [\"TPU v5 lite\"], not {raw!r}")
        return tuple(raw)
    if typing.get_origin(kind) is tuple:
        if not isinstance(raw, list) or not raw:
            raise TpusimError(f"{where} must be a list of axis lengths, e.g. [16, 16, 24], not {raw!r}")
        return tuple(_number(where, key, item, int) for item in raw)
    return _number(where, key, raw, kind)


SMALLEST, LARGEST = 1e-15, 1e24   # a femtosecond; a yottabyte per second: any chip's figure lies between


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
    if raw and not SMALLEST <= raw <= LARGEST:   # 5e-324 B/s passed "> 0" and priced every op at nan ns
        raise TpusimError(f"{where} is {raw:g}: outside {SMALLEST:g}..{LARGEST:g}, where every quantity of a chip "
                          f"lies (in seconds, bytes, FLOP/s, bytes/s or counts)")
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
    for shape in values.get("slice_shapes", ()):
        if not re.fullmatch(r"[1-9][0-9]*(x[1-9][0-9]*)*", shape) or shape.count("x") + 1 != values["torus_dims"]:
            raise TpusimError(f"{path}: [slice_shapes] lists {shape!r}; each shape is {values['torus_dims']} "
                              f"axis lengths joined by x, e.g. {'2x2x4' if values['torus_dims'] == 3 else '2x4'}")
    for ndims in values.get("default_for_dims", ()):
        if max(ndims, 2) != values["torus_dims"]:
            raise TpusimError(f"{path}: default_for_dims lists {ndims} but the chip is a {values['torus_dims']}-D "
                              f"torus; a {ndims}d topology needs a {max(ndims, 2)}-D generation")
    sparse = [key for key in _ZERO_ALLOWED if values[key] == 0]
    if sparse and len(sparse) != len(_ZERO_ALLOWED):
        raise TpusimError(f"{path}: [{sparse[0]}] is 0 but other SparseCore fields are not; a chip "
                          f"without SparseCores has 0 in all of: {', '.join(_ZERO_ALLOWED)}")
