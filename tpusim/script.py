"""Run a user's script as ``__main__`` with its own argv, and show its failures as its own.

``tpusim run`` wraps a script the way ``python script.py`` would: ``sys.argv`` is the
script and its arguments, ``sys.path[0]`` its folder, ``__name__ == "__main__"``. An
exception in the script is returned as the user's traceback (frames from tpusim and
runpy removed), never raised through our internals, so the caller can still write a
partial report. SIGTERM and SIGHUP (``signals_stop_the_script``) stop a script as Ctrl-C does;
``os._exit(n)`` ends it as ``sys.exit(n)`` would (it ended tpusim with it, before anything was written), and a
child the script forked never returns into tpusim (it wrote a second report over the parent's).
"""

from __future__ import annotations

import collections
import contextlib
import os
import runpy
import signal
import sys
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tpusim.errors import TpusimError, plain_text, shown


def _our_paths() -> tuple[str, ...]:
    """tpusim/ (the backend included) and runpy itself."""
    return str(Path(__file__).resolve().parent), str(Path(runpy.__file__).resolve())


_OUR_PATHS = _our_paths()


# what a cancelled CI job, docker stop, Slurm or a closed terminal send (Ctrl-C is SIGINT's KeyboardInterrupt)
STOP_SIGNALS = {signal.SIGTERM: "SIGTERM", signal.SIGHUP: "SIGHUP"}


class Signalled(KeyboardInterrupt):
    """SIGTERM or SIGHUP while the script ran: it stops like Ctrl-C, so what was recorded is still priced."""

    def __init__(self, signum: int) -> None:
        super().__init__(STOP_SIGNALS.get(signum, f"signal {signum}"))
        self.signum = signum


@contextmanager
def signals_stop_the_script() -> Iterator[None]:
    """While the script runs, SIGTERM and SIGHUP raise ``Signalled`` in it (main thread only; a signal
    ignored on purpose stays ignored); the previous handlers are back after."""
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for signum in STOP_SIGNALS:
            if signal.getsignal(signum) is not signal.SIG_IGN:
                previous[signum] = signal.signal(signum, _raise_signalled)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _raise_signalled(signum: int, frame: object) -> None:
    raise Signalled(signum)


class ScriptExited(BaseException):
    """The script called ``os._exit(code)``: it ends here, and the run goes on to price what it recorded."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


@contextmanager
def exits_end_only_the_script() -> Iterator[None]:
    """While the script runs, ``os._exit`` in this process raises ``ScriptExited``; a child the script forked
    keeps its own ``os._exit``, and one that reaches the script's end (however it got there) ends there."""
    parent, real_exit = os.getpid(), os._exit

    def _exit(code: int) -> None:
        if os.getpid() != parent:
            real_exit(code)
        raise ScriptExited(code)

    os._exit = _exit
    try:
        yield
    finally:
        if os.getpid() != parent:
            sys.stdout.flush()
            sys.stderr.flush()
            real_exit(0)
        os._exit = real_exit


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
        with exits_end_only_the_script():
            runpy.run_path(str(script), run_name="__main__")
        return ScriptOutcome(exit_code=0)
    except ScriptExited as stop:
        return ScriptOutcome(exit_code=stop.code & 0xFF)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if stop.code is not None and not isinstance(stop.code, int):
            print(stop.code, file=sys.stderr)
        return ScriptOutcome(exit_code=code)
    except Signalled as stop:           # as the shell reports a process a signal ended: 128 + the signal
        return ScriptOutcome(exit_code=128 + stop.signum, error=f"{stop}\n", error_type=str(stop))
    except KeyboardInterrupt:
        return ScriptOutcome(exit_code=130, error="KeyboardInterrupt\n", error_type="KeyboardInterrupt")
    except BaseException as error:  # the user's exception, whatever it is
        return ScriptOutcome(exit_code=1, error=user_traceback(error), error_type=type(error).__name__)
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        _reopen_closed_streams()


def wait_for_script_threads(before: set[threading.Thread], code: int) -> int:
    """After the report: wait, as ``python script.py`` does, for the threads the script started that do not end
    (not daemon threads), saying so once; a Ctrl-C then ends the process at once (exit 130). Before, tpusim sat
    silent after its summary (issue 44, S08). Returns ``code`` when there is nothing to wait for."""
    left = [t for t in threading.enumerate() if t not in before and t.is_alive() and not t.daemon]
    if not left:
        return code
    names = ", ".join(repr(t.name) for t in left[:5]) + (f" and {len(left) - 5} more" if len(left) > 5 else "")
    try:                                   # a Ctrl-C right after the line is said stops the wait too
        print(f"tpusim: the report is written; the script's thread{'s' if len(left) > 1 else ''} {names} still "
              f"run{'' if len(left) > 1 else 's'} (not daemon threads): waiting for "
              f"{'them' if len(left) > 1 else 'it'} to end, as python does (Ctrl-C stops waiting)",
              file=sys.stderr, flush=True)
        for thread in left:
            thread.join()
    except KeyboardInterrupt:
        print("tpusim: stopped waiting for the script's threads (Ctrl-C); the report is kept", file=sys.stderr)
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(130)                      # Python's own exit would wait for them again
    return code


def _reopen_closed_streams() -> None:
    """A script that closed sys.stdout or sys.stderr (issue 32, row 9: the summary then died in a ValueError):
    Python's own streams never close their file descriptors, so tpusim writes to fresh streams on them."""
    for name, fd in (("stdout", 1), ("stderr", 2)):
        stream = getattr(sys, name)
        if stream is None or stream.closed:
            setattr(sys, name, open(fd, "w", closefd=False, buffering=1, encoding="utf-8",  # noqa: SIM115
                                    errors="backslashreplace"))


MAX_FRAMES = 1000      # of a traceback, the last ones (where it failed); a recursion 10 million deep is not a hang


def user_traceback(error: BaseException) -> str:
    """The traceback as the user would see it from ``python script.py``: our frames dropped, and of a very deep
    one (a RecursionError under ``sys.setrecursionlimit(10**7)``) the last ``MAX_FRAMES`` only, as Python prints
    it: summing up every frame took minutes and gigabytes (issue 44, S24)."""
    last: collections.deque = collections.deque(maxlen=MAX_FRAMES + 1)
    tb = error.__traceback__
    while tb is not None:                # a plain walk: cheap even 10 million deep
        last.append(tb)
        tb = tb.tb_next
    cut = len(last) > MAX_FRAMES
    start = last[1] if cut else error.__traceback__
    summary = traceback.TracebackException(type(error), error, start)
    summary.stack = traceback.StackSummary.from_list(
        [frame for frame in summary.stack if not _is_ours(frame.filename)])
    lines = list(summary.format())
    if cut:
        lines.insert(1, f"  ... (the first frames are left out: the last {MAX_FRAMES} are shown)\n")
    return "".join(lines)


def _is_ours(filename: str) -> bool:
    if filename.startswith("<frozen runpy>"):
        return True
    resolved = os.path.abspath(filename)
    return any(resolved.startswith(prefix) for prefix in _OUR_PATHS)
