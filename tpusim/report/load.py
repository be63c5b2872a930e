"""report.json read back (``tpusim compare``, notebooks): its schema, version and every field checked
first, so a file that is not a tpusim report of a version this tpusim reads is one TpusimError
that says what the file is and what is expected, never a KeyError from deep inside a reader.

The check is the typed model's (``tpusim.report.schema.Report``, whose JSON Schema is written beside
report.json); its first complaint becomes the one error, naming the JSON path.

Versions read: ``READ_VERSIONS``. Version 1 lacks ``exit_code`` and ``interrupted`` (the model's None); versions 1
and 2 took ``step_time_median_s`` (and ``mfu``) over every step after the first, warm-up compiles included,
where version 3 takes the steady state (``median_meaning`` says which, and ``tpusim compare`` notes a mixed pair);
versions 1-3 wrote the whole program's time as ``step_time_median_s`` of a script that marked no steps, read
here as null, as version 4 writes it. Version 5 adds ``inference`` (null in older ones). Versions 1-5 named HFU
``mfu`` (and an inference phase's ``mxu_utilisation``), and the headline's peak ``mfu_peak_flops_per_s``: read here
under version 6's names (``HFU_SINCE``). Everything else a reader needs is the same.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tpusim.errors import TpusimError, shown
from tpusim.report.model import SCHEMA, SCHEMA_VERSION
from tpusim.report.schema import Report

READ_VERSIONS = (1, 2, 3, 4, 5, SCHEMA_VERSION)
HFU_SINCE = 6               # the first version that names HFU ``hfu`` (older: ``mfu``, a field that held HFU)
NO_STEPS_NULL_SINCE = 4     # the first version that writes no step time for a script without steps
STEADY_MEDIAN_SINCE = 3     # the first version whose step_time_median_s leaves warm-up steps out


def median_meaning(report: Report) -> str:
    """What a checked report's ``step_time_median_s`` is the median of, in words."""
    if report.version >= STEADY_MEDIAN_SINCE:
        return "the steady-state steps (warm-up steps that compiled left out)"
    return "every step after the first (warm-up compiles included)"


_WORDS = {"string_type": "text", "bool_type": "true or false", "list_type": "a list", "dict_type": "an object",
          "model_type": "an object", "model_attributes_type": "an object", "int_type": "a whole number",
          "none_required": "null"}


def _problem(error: ValidationError, file: Path) -> TpusimError:
    """The first thing the schema found wrong, as one sentence naming the JSON path."""
    first = error.errors(include_url=False)[0]
    where = ".".join(str(part) for part in first["loc"])
    if first["type"] in ("missing", "missing_key"):
        where += f".{first['msg']}" if first["type"] == "missing_key" else ""
        return TpusimError(f"{file}: not a complete tpusim report: {where} is missing")
    if first["type"] == "extra_forbidden":
        return TpusimError(f"{file}: {where} is no field of a tpusim report (written by a newer tpusim?)")
    wanted = _WORDS.get(first["type"], first["msg"])
    return TpusimError(f"{file}: {where} must be {wanted}, not {shown(first.get('input'), 60)}")


def check_report(report: Any, file: Path) -> Report:
    """``report`` (parsed JSON) as a ``Report`` when it is a tpusim report of a version this tpusim reads
    that the schema (tpusim/report/schema.py) validates; else one TpusimError naming the file and what is
    wrong."""
    if not isinstance(report, dict) or report.get("schema") != SCHEMA:
        what = f"a JSON {type(report).__name__.replace('dict', 'object')}" if not isinstance(report, dict) else \
            "a JSON object without schema 'tpusim-report'"
        raise TpusimError(f"{file}: not a tpusim report ({what}); give a report.json written by `tpusim run`")
    version = report.get("version")
    if isinstance(version, bool) or version not in READ_VERSIONS:
        hint = ""
        if isinstance(version, int) and not isinstance(version, bool):
            hint = (" (written by a newer tpusim: update tpusim to read it)" if version > SCHEMA_VERSION else
                    " (written by an older tpusim: run the script again to write a new one)")
        raise TpusimError(f"{file}: report schema version {shown(version, 40)} is not one this tpusim reads "
                          f"(it reads versions {', '.join(map(str, READ_VERSIONS))}){hint}")
    if version < HFU_SINCE:
        report = hfu_named(report)
    try:
        checked = Report.model_validate(report)
    except ValidationError as error:
        raise _problem(error, file) from None
    if checked.version < NO_STEPS_NULL_SINCE:
        modes = {name: mode.model_copy(update={"step_time_median_s": None})
                 if mode.steps is not None and not mode.steps.count else mode for name, mode in checked.modes.items()}
        checked = checked.model_copy(update={"modes": modes})
    return checked


def _renamed(part: Any, names: dict[str, str]) -> Any:
    """``part`` with each old key in ``names`` under its new name (an object; anything else as it is)."""
    if not isinstance(part, dict):
        return part
    return {names.get(key, key) if names.get(key) not in part else key: value for key, value in part.items()}


def hfu_named(report: dict[str, Any]) -> dict[str, Any]:
    """A report of version 1-5 with its utilisation fields under version 6's names: ``mfu`` held HFU (every FLOP
    run over the peak), so it is read as ``hfu``, never as the model FLOPs utilisation MFU means."""
    modes = report.get("modes")
    if isinstance(modes, dict):
        modes = {name: _mode_hfu_named(mode) for name, mode in modes.items()}
        report = {**report, "modes": modes}
    inference = report.get("inference")
    if isinstance(inference, dict) and isinstance(inference.get("modes"), dict):
        phases = {"prefill", "decode"}
        served = {name: {key: _renamed(value, {"mxu_utilisation": "hfu"}) if key in phases else value
                         for key, value in mode.items()} if isinstance(mode, dict) else mode
                  for name, mode in inference["modes"].items()}
        report = {**report, "inference": {**inference, "modes": served}}
    return report


def _mode_hfu_named(mode: Any) -> Any:
    mode = _renamed(mode, {"mfu": "hfu"})
    if isinstance(mode, dict) and isinstance(mode.get("headline"), dict):
        mode = {**mode, "headline": _renamed(mode["headline"], {"mfu": "hfu", "mfu_peak_flops_per_s":
                                                                "peak_flops_per_s"})}
    return mode


def report_file(path: str | Path) -> Path:
    """The report.json a user named: the file itself, or the one in the folder given."""
    given = Path(path)
    return given if given.suffix == ".json" else given / "report.json"


def _whole_number(text: str) -> int:
    """A JSON integer; one past float's range (a 401-digit "count") is refused as too long: every reader of a
    report divides by its numbers as floats (compare, sweep: OverflowError, issue 44)."""
    if len(text.lstrip("-")) > 308:
        raise ValueError(text)
    return int(text)


def load_report(path: str | Path) -> tuple[Report, Path]:
    """A report folder (or its report.json) -> (the checked report, its folder); any problem is one
    TpusimError: missing, unreadable, not UTF-8 JSON, not a tpusim report, a version not read, a field
    of the wrong kind."""
    file = report_file(path)
    if not file.is_file():
        raise TpusimError(f"{shown(str(path))}: no report.json there (give a folder written by `tpusim run`)")
    try:
        text = file.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise TpusimError(f"{file}: not a tpusim report (not UTF-8 text)") from None
    except OSError as error:
        raise TpusimError(f"{file}: cannot read: {error.strerror or error}") from None
    try:
        report = json.loads(text, parse_int=_whole_number)
    except json.JSONDecodeError as error:
        raise TpusimError(f"{file}: not valid JSON ({error.msg} at line {error.lineno}); a report.json "
                          f"written by `tpusim run` is whole JSON") from None
    except (ValueError, RecursionError):
        raise TpusimError(f"{file}: not a tpusim report (JSON nested too deeply or a number too long)") from None
    return check_report(report, file), file.parent
