"""Run a user's script as ``__main__`` with its own argv, and show its failures as its own.

``tpusim run`` wraps a script the way ``python script.py`` would: ``sys.argv`` is the
script and its arguments, ``sys.path[0]`` its folder, ``__name__ == "__main__"``. An
exception in the script is returned as the user's traceback (frames from tpusim and
runpy removed), never raised through our internals, so the caller can still write a
partial report.
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

from tpusim.errors import TpusimError, plain_text, shown


def _our_paths() -> tuple[str, ...]:
    """tpusim/ (the backend included) and runpy itself."""
    return str(Path(__file__).resolve().parent), str(Path(runpy.__file__).resolve())


_OUR_PATHS = _our_paths()


@dataclass(frozen=True)
class ScriptOutcome:
    exit_code: int                 # what `python script.py` would have exited with
    error: str | None = None       # the user's traceback, formatted; None when it finished
    error_type: str | None = None  # e.g. "RuntimeError"


def check_script(path: str) -> Path:
    """The script's resolved path, or one TpusimError saying why it cannot run (missing, a folder,
    unreadable, a name with a control character in it)."""
    plain_text(path, "script", "give the path of a Python file, e.g. examples/mlp.py", max_length=4096,
               ascii_only=False)
    script = Path(path)
    hint = "give the path of a Python file, e.g. examples/mlp.py"
    try:
        if script.is_dir():
            raise TpusimError(f"script {shown(path)} is a folder, not a Python file ({hint})")
        if not script.is_file():
            raise TpusimError(f"script {shown(path)} does not exist ({hint})")
        if not os.access(script, os.R_OK):
            raise TpusimError(f"script {shown(path)} cannot be read (permission denied)")
        return script.resolve()
    except OSError as error:            # a name too long for the file system, ...
        raise TpusimError(f"script {shown(path)} cannot be read: {error.strerror or error}") from None


def run_script(path: str | Path, argv: list[str]) -> ScriptOutcome:
    """Execute ``path`` as ``__main__`` with ``argv`` after it; restore sys state afterwards."""
    script = check_script(str(path))
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [str(script), *argv]
    sys.path.insert(0, str(script.parent))
    try:
        runpy.run_path(str(script), run_name="__main__")
        return ScriptOutcome(exit_code=0)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if stop.code is not None and not isinstance(stop.code, int):
            print(stop.code, file=sys.stderr)
        return ScriptOutcome(exit_code=code)
    except KeyboardInterrupt:
        return ScriptOutcome(exit_code=130, error="KeyboardInterrupt\n", error_type="KeyboardInterrupt")
    except BaseException as error:  # the user's exception, whatever it is
        return ScriptOutcome(exit_code=1, error=user_traceback(error), error_type=type(error).__name__)
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path


def user_traceback(error: BaseException) -> str:
    """The traceback as the user would see it from ``python script.py``: our frames dropped."""
    summary = traceback.TracebackException.from_exception(error)
    summary.stack = traceback.StackSummary.from_list(
        [frame for frame in summary.stack if not _is_ours(frame.filename)])
    return "".join(summary.format())


def _is_ours(filename: str) -> bool:
    if filename.startswith("<frozen runpy>"):
        return True
    resolved = os.path.abspath(filename)
    return any(resolved.startswith(prefix) for prefix in _OUR_PATHS)
