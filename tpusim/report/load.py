"""report.json read back (``tpusim compare``, notebooks): its schema, version and every field checked
first, so a file that is not a tpusim report of a version this tpusim reads is one TpusimError
that says what the file is and what is expected, never a KeyError from deep inside a reader.

The check is the typed model's (``tpusim.report.schema.Report``, whose JSON Schema is written beside
report.json); its first complaint becomes the one error, naming the JSON path.

Versions read: ``READ_VERSIONS``. Version 1 lacks ``exit_code`` and ``interrupted`` (the model's None); versions 1
and 2 took ``step_time_median_s`` (and ``mfu``) over every step after the first, warm-up compiles included,
where version 3 takes the steady state (``median_meaning`` says which, and ``tpusim compare`` notes a mixed pair);
versions 1-3 wrote the whole program's time as ``step_time_median_s`` of a script that marked no steps, read
here as null, as version 4 writes it. Version 5 adds ``inference`` (null in older ones). Everything else a
reader needs is the same.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tpusim.errors import TpusimError, shown
from tpusim.report.model import SCHEMA, SCHEMA_VERSION
from tpusim.report.schema import Report

READ_VERSIONS = (1, 2, 3, 4, SCHEMA_VERSION)
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
    try:
        checked = Report.model_validate(report)
    except ValidationError as error:
        raise _problem(error, file) from None
    if checked.version < NO_STEPS_NULL_SINCE:
        modes = {name: mode.model_copy(update={"step_time_median_s": None})
                 if mode.steps is not None and not mode.steps.count else mode for name, mode in checked.modes.items()}
        checked = checked.model_copy(update={"modes": modes})
    return checked


def report_file(path: str | Path) -> Path:
    """The report.json a user named: the file itself, or the one in the folder given."""
    given = Path(path)
    return given if given.suffix == ".json" else given / "report.json"


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
        report = json.loads(text)
    except json.JSONDecodeError as error:
        raise TpusimError(f"{file}: not valid JSON ({error.msg} at line {error.lineno}); a report.json "
                          f"written by `tpusim run` is whole JSON") from None
    except (ValueError, RecursionError):
        raise TpusimError(f"{file}: not a tpusim report (JSON nested too deeply or a number too long)") from None
    return check_report(report, file), file.parent
