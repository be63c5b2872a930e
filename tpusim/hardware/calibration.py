"""One calibration per chip generation: model terms fitted to published TPU measurements.

A chip file (``topologies/chips/<chip>.toml``) says what the datasheet says: peak FLOP/s, HBM and
ICI bandwidth. A compiled TPU program reaches less than that, and by how much is a measurement,
not a datasheet figure. ``topologies/calibration/<chip>.toml`` holds those measured shares for one
generation, each value with where it came from:

- ``source``: a published figure read directly (a page and what it says);
- ``fitted_on = [case, ...]``: fitted to these ``tpusim validate`` cases (``method`` says how), so
  ``tpusim validate`` reports its error on every *other* case as the held-out error;
- ``estimate``: no public basis, with the reasoning.

``load_calibration("v5p")`` reads a file; ``calibrated(chip)`` returns the chip with its
calibration applied (the chip itself when the generation has no file). What each parameter does
is one row of ``PARAMETERS``: a share that scales a ChipSpec rate, a ChipSpec field it replaces, or
an opt-in term of ``tpusim.hardware.compute`` (``CalibrationTerms``) that a plain ChipSpec does not carry.
Adding a parameter = one row there (and, for a new kind of term, its use in compute.py).

Who loads it: every command that prices (``run``, ``check``, ``compare``, ``collective``, ``sweep``,
``validate``), through ``tpusim.slice.topology.build_slice(calibrated=True)``; ``--no-calibration`` prices
the datasheet chip. Report.json's ``chip.calibration`` and the summary say which was used.

File format (one table per parameter)::

    chip = "v5p"                 # must equal the file name

    [mxu_efficiency]
    value = 0.9
    fitted_on = ["maxtext-v5p-32b"]
    method = "least squares on the case's step time"   # optional with fitted_on
    note = "..."                 # optional, any table
"""

from __future__ import annotations

import dataclasses
import functools
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from tpusim.errors import TpusimError
from tpusim.hardware.compute import CalibrationTerms
from tpusim.hardware.spec import ChipSpec, topologies_dir

__all__ = ["PARAMETERS", "CalibratedChip", "Calibration", "Parameter", "ParameterKind", "add_calibration_argument",
           "available_calibrations", "calibrated", "calibration_dir", "calibration_label", "calibration_text",
           "datasheet_chip", "load_calibration"]


@dataclass(frozen=True)
class ParameterKind:
    """What a calibration parameter does to a chip.

    ``how`` is one of: ``term`` (sets the ``tpusim.hardware.compute.CalibrationTerms`` field of that name),
    ``scale`` (multiplies the ChipSpec field ``target``), ``replace`` (sets the ChipSpec field
    ``target``). ``share``: the value is a fraction of a datasheet figure, so it lies in (0, 1].
    """

    how: str
    target: str
    meaning: str
    share: bool = False


PARAMETERS: dict[str, ParameterKind] = {
    "mxu_efficiency": ParameterKind(
        "term", "mxu_efficiency", "achieved share of the MXU peak on matmuls in a compiled program", True),
    "hbm_efficiency": ParameterKind(
        "term", "hbm_efficiency", "achieved share of the HBM bandwidth", True),
    "mxu_weight_load_cycles": ParameterKind(
        "term", "mxu_weight_load_cycles", "cycles to load one weight tile into the MXU: the fewest LHS rows "
        "that hide it (skinny matmuls wait for weights)"),
    "mxu_fill_drain_cycles": ParameterKind(
        "term", "mxu_fill_drain_cycles", "cycles the systolic array takes to fill and drain, once per matmul"),
    "ici_link_efficiency": ParameterKind(
        "scale", "ici_link_bytes_per_s", "achieved share of one ICI link's one-way bandwidth in a collective",
        True),
    "dcn_efficiency": ParameterKind(
        "scale", "dcn_bytes_per_s", "achieved share of the per-chip DCN bandwidth", True),
    "dcn_latency_ns": ParameterKind(
        "replace", "dcn_latency_ns", "latency of one DCN crossing, paid once per ring or tree step over the slices "
        "(ns)"),
    "collective_overhead_ns": ParameterKind(
        "replace", "collective_overhead_ns", "fixed start-up cost of one collective (ns)"),
    "ici_hop_latency_ns": ParameterKind(
        "replace", "ici_hop_latency_ns", "latency of one ICI hop (ns)"),
    "kernel_launch_ns": ParameterKind(
        "replace", "kernel_launch_ns", "fixed cost of one kernel on a TensorCore (ns)"),
}

_BASIS_KEYS = ("source", "fitted_on", "estimate")
_TABLE_KEYS = ("value", *_BASIS_KEYS, "method", "note")


@dataclass(frozen=True)
class Parameter:
    """One calibrated value and its basis: exactly one of ``source``, ``fitted_on``, ``estimate``."""

    name: str
    value: float
    source: str = ""
    fitted_on: tuple[str, ...] = ()
    estimate: str = ""
    method: str = ""
    note: str = ""

    @property
    def basis(self) -> str:
        """'source', 'fitted' or 'estimate'."""
        return "source" if self.source else "fitted" if self.fitted_on else "estimate"

    def describe(self) -> str:
        if self.source:
            return f"source: {self.source}"
        if self.fitted_on:
            how = f" ({self.method})" if self.method else ""
            return f"fitted on {', '.join(self.fitted_on)}{how}"
        return f"estimate: {self.estimate}"

    def to_dict(self) -> dict:
        out: dict = {"value": self.value, "basis": self.basis}
        for key in ("source", "estimate", "method", "note"):
            if getattr(self, key):
                out[key] = getattr(self, key)
        if self.fitted_on:
            out["fitted_on"] = list(self.fitted_on)
        return out


@dataclass(frozen=True)
class Calibration:
    """The calibration of one chip generation: parameters by name, and where they were read from."""

    chip: str
    parameters: dict[str, Parameter] = field(default_factory=dict)
    path: str = ""

    @property
    def fitted_cases(self) -> frozenset[str]:
        """Every case some parameter was fitted on: validate's held-out error leaves these out."""
        return frozenset(case for p in self.parameters.values() for case in p.fitted_on)

    def with_value(self, name: str, value: float) -> Calibration:
        """A copy with one parameter's value changed (sensitivity studies); the basis is kept."""
        if name not in self.parameters:
            raise TpusimError(f"calibration of {self.chip} has no parameter {name!r}; it has: "
                              f"{', '.join(self.parameters) or 'none'}")
        params = dict(self.parameters)
        params[name] = dataclasses.replace(params[name], value=value)
        return dataclasses.replace(self, parameters=params)

    def apply(self, chip: ChipSpec) -> CalibratedChip:
        """``chip`` with every parameter applied (``PARAMETERS`` says how); terms not set stay 1.0."""
        if chip.name != self.chip:
            raise TpusimError(f"calibration {self.path or self.chip} is for chip {self.chip!r}, not {chip.name!r}")
        fields = {f.name: getattr(chip, f.name) for f in dataclasses.fields(ChipSpec)}
        terms: dict[str, float] = {}
        for name, param in self.parameters.items():
            kind = PARAMETERS[name]
            if kind.how == "term":
                terms[kind.target] = param.value
            elif kind.how == "scale":
                fields[kind.target] = fields[kind.target] * param.value
            else:
                fields[kind.target] = type(fields[kind.target])(param.value)
        return CalibratedChip(**fields, terms=CalibrationTerms(**terms), calibration=self.path or self.chip,
                              datasheet=chip)

    def to_dict(self) -> dict:
        return {"chip": self.chip, "path": self.path,
                "parameters": {name: p.to_dict() for name, p in self.parameters.items()}}


@dataclass(frozen=True)
class CalibratedChip(ChipSpec):
    """A ChipSpec with a calibration applied: rates and costs replaced as ``PARAMETERS`` says, plus the
    opt-in ``tpusim.hardware.compute`` terms (``terms``) that a plain ChipSpec does not carry."""

    terms: CalibrationTerms = CalibrationTerms()
    calibration: str = ""                  # the calibration file it came from
    datasheet: ChipSpec | None = None      # the chip before it (what a recording process is configured with)


def datasheet_chip(chip: ChipSpec) -> ChipSpec:
    """The chip as its chip file says, calibrated or not (a recording needs the chip's facts, not its shares)."""
    return chip.datasheet if isinstance(chip, CalibratedChip) and chip.datasheet is not None else chip


# --------------------------------------------------------------------------- loading

NO_CALIBRATION_HELP = ("price the datasheet chip (default: the chip with its calibration, "
                       "topologies/calibration/<chip>.toml: what compiled programs reach on real TPUs)")


def add_calibration_argument(parser) -> None:
    """``--no-calibration``, for every command that prices (run, check, compare, collective, sweep, validate)."""
    parser.add_argument("--no-calibration", action="store_true", help=NO_CALIBRATION_HELP)


def calibration_label(chip: ChipSpec) -> str:
    """What report.json says of a chip: its calibration file, or 'datasheet'."""
    return _shown_path(chip.calibration) if isinstance(chip, CalibratedChip) else "datasheet"


def calibration_text(chip: ChipSpec) -> str:
    """What a summary says of a chip: 'calibrated: topologies/calibration/v5p.toml', or why it is not."""
    if isinstance(chip, CalibratedChip):
        return f"calibrated: {_shown_path(chip.calibration)}"
    if load_calibration(chip.name) is None:
        return f"datasheet: {chip.name} has no calibration file"
    return "datasheet: --no-calibration"


def _shown_path(path: str) -> str:
    """A calibration file's path from topologies/ on (the install folder says nothing to a user)."""
    parts = Path(path).parts
    return str(Path(*parts[-3:])) if len(parts) >= 3 else path


def calibration_dir() -> Path:
    """``topologies/calibration/`` (``$TPUSIM_TOPOLOGIES/calibration`` when that is set)."""
    return topologies_dir() / "calibration"


def error_bands_path() -> Path:
    """``topologies/fidelity/error_bands.toml``: each mode's validated error band (tpusim/validate/bands.py writes
    it, tpusim/report/fidelity.py reads it); beside the calibrations, not among them (every file there is a chip's)."""
    return topologies_dir() / "fidelity" / "error_bands.toml"


@functools.cache
def error_bands() -> dict[str, dict]:
    """The bands file's tables by key ({} when it is missing or unreadable: nothing validated). A key is the
    mode a published run used ("compile", "fused", "strict") priced by tpusim's model, or that mode and the
    compiler path that priced it ("compile@xla": the TPU compiler's programs); ``band_key`` spells it."""
    try:
        data = tomllib.loads(error_bands_path().read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return {}
    return {key: band for key, band in data.items() if isinstance(band, dict)}


def band_key(mode: str, compiler: str = "model") -> str:
    """The bands file's key of ``mode`` priced through ``compiler`` ("model" or "xla")."""
    return mode if compiler == "model" else f"{mode}@{compiler}"


def available_calibrations() -> list[str]:
    """Chips that have a calibration file, by name."""
    folder = calibration_dir()
    return sorted(p.stem for p in folder.glob("*.toml")) if folder.is_dir() else []


def load_calibration(chip: str) -> Calibration | None:
    """The calibration of chip generation ``chip`` ("v5p"), or None when it has no file."""
    path = calibration_dir() / f"{chip.strip().lower()}.toml"
    if not path.is_file():
        return None
    return _load(str(path))


def calibrated(chip: ChipSpec, calibration: Calibration | None | bool = True) -> ChipSpec:
    """``chip`` with a calibration applied: ``True`` = its generation's file (the chip unchanged when
    there is none), ``False``/``None`` = no calibration, or a ``Calibration`` to apply. A chip already
    calibrated stays as it is for ``True`` (a share applied twice would be squared)."""
    if calibration is True and isinstance(chip, CalibratedChip):
        return chip
    if calibration is True:
        calibration = load_calibration(chip.name)
    if not calibration:
        return chip
    return calibration.apply(chip)


@functools.cache
def _load(path: str) -> Calibration:
    """Parse and check one calibration file; each problem is one TpusimError naming the file and key."""
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except tomllib.TOMLDecodeError as error:
        raise TpusimError(f"{path}: not valid TOML: {error}") from None
    stem = Path(path).stem
    chip = data.pop("chip", None)
    if chip != stem:
        raise TpusimError(f"{path}: chip = {chip!r} but the file is {stem}.toml; say chip = \"{stem}\"")
    params: dict[str, Parameter] = {}
    for name, table in data.items():
        if name not in PARAMETERS:
            raise TpusimError(f"{path}: unknown parameter {name!r}; accepted: {', '.join(PARAMETERS)}")
        params[name] = _parameter(path, name, table)
    return Calibration(chip=stem, parameters=params, path=path)


def _parameter(path: str, name: str, table: object) -> Parameter:
    where = f"{path}: [{name}]"
    if not isinstance(table, dict):
        raise TpusimError(f"{where} must be a table with 'value' and one of {', '.join(_BASIS_KEYS)}")
    extra = [key for key in table if key not in _TABLE_KEYS]
    if extra:
        raise TpusimError(f"{where} has unknown key {extra[0]!r}; accepted: {', '.join(_TABLE_KEYS)}")
    value = table.get("value")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise TpusimError(f"{where} value must be a finite number > 0, not {value!r}")
    if PARAMETERS[name].share and value > 1:
        raise TpusimError(f"{where} value {value:g} is a share of a datasheet figure: it must be <= 1")
    bases = [key for key in _BASIS_KEYS if key in table]
    if len(bases) != 1:
        raise TpusimError(f"{where} has {' and '.join(bases) or 'none'} of {', '.join(_BASIS_KEYS)}; give "
                          f"exactly one: source = the published figure, fitted_on = [the validate cases it was "
                          f"fitted to], or estimate = the reasoning when there is no public basis")
    fitted = table.get("fitted_on", [])
    if "fitted_on" in table and (not isinstance(fitted, list) or not fitted
                                 or not all(isinstance(c, str) and c for c in fitted)):
        raise TpusimError(f"{where} fitted_on must be a non-empty list of case names, not {fitted!r}")
    texts = {key: table.get(key, "") for key in ("source", "estimate", "method", "note")}
    for key, text in texts.items():
        if not isinstance(text, str) or (key in table and not text.strip()):
            raise TpusimError(f"{where} {key} must be non-empty text")
    return Parameter(name=name, value=float(value), fitted_on=tuple(fitted),
                     **{key: text.strip() for key, text in texts.items()})
