"""report.json read back (``tpusim compare``, notebooks): its schema, version and the fields readers use
checked first, so a file that is not a tpusim report of a version this tpusim reads is one TpusimError
that says what the file is and what is expected, never a KeyError from deep inside a reader.

Versions read: ``READ_VERSIONS``. Version 1 lacks ``exit_code`` and ``interrupted`` (readers use
``.get``); versions 1 and 2 took ``step_time_median_s`` (and ``mfu``) over every step after the first,
warm-up compiles included, where version 3 takes the steady state (``median_meaning`` says which, and
``tpusim compare`` notes a mixed pair); everything else a reader needs is the same.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from tpusim.errors import TpusimError, shown
from tpusim.report.model import SCHEMA, SCHEMA_VERSION

READ_VERSIONS = (1, 2, SCHEMA_VERSION)
STEADY_MEDIAN_SINCE = 3     # the first version whose step_time_median_s leaves warm-up steps out


def median_meaning(report: dict[str, Any]) -> str:
    """What a checked report's ``step_time_median_s`` is the median of, in words."""
    if report["version"] >= STEADY_MEDIAN_SINCE:
        return "the steady-state steps (warm-up steps that compiled left out)"
    return "every step after the first (warm-up compiles included)"

# what readers need, by JSON path: "text", "number", "whole", "flag", "list", "object"
_TOP = {"complete": "flag", "run": "object", "chip": "object", "slice": "object", "program": "object",
        "modes": "object", "warnings": "list"}
_RUN = {"script": "text", "argv": "list", "topology": "text", "chip": "text", "numerics": "text",
        "torch_version": "text", "modes": "list"}
_CHIP = {"name": "text", "display_name": "text", "peak_bf16_flops_per_s": "number", "hbm_bytes_per_s": "number"}
_SLICE = {"chips": "whole", "dims": "list"}
_MODE = {"total_s": "number", "step_time_median_s": "number", "kernels": "whole", "mfu": "number",
         "host_s": "object", "device_s": "object", "hbm": "object"}
_MODE_PARTS = {"host_s": {"stall": "number"}, "device_s": {"collective_exposed": "number"},
               "hbm": {"peak_bytes": "number"}}


def _is(value: Any, kind: str) -> bool:
    if kind == "text":
        return isinstance(value, str)
    if kind == "flag":
        return isinstance(value, bool)
    if kind == "list":
        return isinstance(value, list)
    if kind == "object":
        return isinstance(value, dict)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value) and (kind == "number" or float(value).is_integer())


_WORDS = {"text": "text", "flag": "true or false", "list": "a list", "object": "an object",
          "number": "a finite number", "whole": "a whole number"}


def _check(where: str, data: dict[str, Any], wanted: dict[str, str], file: Path) -> None:
    for key, kind in wanted.items():
        if key not in data:
            raise TpusimError(f"{file}: not a complete tpusim report: {where}{key} is missing")
        if not _is(data[key], kind):
            raise TpusimError(f"{file}: {where}{key} must be {_WORDS[kind]}, not {shown(data[key], 60)}")


def check_report(report: Any, file: Path) -> dict[str, Any]:
    """``report`` (parsed JSON) when it is a tpusim report of a version this tpusim reads, with every field
    readers use of the right type; else one TpusimError naming the file and what is wrong."""
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
    _check("", report, _TOP, file)
    _check("run.", report["run"], _RUN, file)
    _check("chip.", report["chip"], _CHIP, file)
    _check("slice.", report["slice"], _SLICE, file)
    for mode, entry in report["modes"].items():
        if not isinstance(entry, dict):
            raise TpusimError(f"{file}: modes.{mode} must be an object, not {shown(entry, 60)}")
        _check(f"modes.{mode}.", entry, _MODE, file)
        for part, wanted in _MODE_PARTS.items():
            _check(f"modes.{mode}.{part}.", entry[part], wanted, file)
    return report


def report_file(path: str | Path) -> Path:
    """The report.json a user named: the file itself, or the one in the folder given."""
    given = Path(path)
    return given if given.suffix == ".json" else given / "report.json"


def load_report(path: str | Path) -> tuple[dict[str, Any], Path]:
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
