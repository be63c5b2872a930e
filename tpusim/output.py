"""Where a run writes: the ``--out`` folder checked and claimed before the script runs, and every file
written atomically under a unique temporary name.

A file is written to ``.<name>.<pid>.<random>.tmp`` beside it and renamed over ``<name>`` only once it
is whole, so a crash, a kill -9 or Ctrl-C leaves either the old file or the new one, never half of one;
two processes writing the same name never share a temporary file. A run *claims* its folder with an
advisory lock (``flock`` on the folder itself, so nothing is left behind and a killed run releases it):
a second run into the same ``--out`` while the first is still writing is refused with one clear error
instead of mixing its files with the first run's.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from tpusim.errors import TpusimError

try:
    import fcntl
except ImportError:             # not POSIX: folders are not locked
    fcntl = None  # type: ignore[assignment]


def cache_dir(name: str) -> Path:
    """Where tpusim keeps what it can compute again (``name``: "xla", "validate"): $XDG_CACHE_HOME/tpusim/NAME,
    else ~/.cache/tpusim/NAME."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tpusim" / name


def temporary_name(path: Path) -> Path:
    """A name beside ``path`` that no other writer (process or thread) uses: ``.name.<pid>.<random>.tmp``."""
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w") -> Iterator[IO]:
    """Open a temporary file beside ``path`` for writing; on success it replaces ``path`` in one rename,
    on any error (or KeyboardInterrupt) it is removed and ``path`` is left as it was."""
    path = Path(path)
    tmp = temporary_name(path)
    # O_EXCL: never reuse a name; 0o666 & umask: the permissions a plain open() would give
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with open(fd, mode, encoding=None if "b" in mode else "utf-8") as handle:
            yield handle
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_atomic(path: str | Path, data: str | bytes) -> None:
    """Write ``data`` (text or bytes) to ``path`` atomically (see ``atomic_open``)."""
    with atomic_open(path, "wb" if isinstance(data, bytes) else "w") as handle:
        handle.write(data)


def _why(error: OSError) -> str:
    return error.strerror or type(error).__name__


def prepare_folder(folder: str | Path, flag: str = "--out") -> Path:
    """Create ``folder`` (and its parents) and check a file can be written there; any problem is one
    TpusimError naming the flag, the folder and the reason."""
    out = Path(folder)
    try:
        if out.exists() and not out.is_dir():
            raise TpusimError(f"{flag} {str(out)!r} exists and is not a folder; give a folder for the report")
        out.mkdir(parents=True, exist_ok=True)  # a name too long for the file system fails here or above
    except OSError as error:
        where = f" ({str(error.filename)!r})" if error.filename and str(error.filename) != str(out) else ""
        raise TpusimError(f"{flag} {str(out)!r}: cannot create the folder: {_why(error)}{where}") from None
    probe = temporary_name(out / "probe")
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        probe.unlink()
    except OSError as error:
        raise TpusimError(f"{flag} {str(out)!r}: cannot write files there: {_why(error)}") from None
    return out


class FolderClaim:
    """This process's claim on a report folder: held until ``release`` or the process ends."""

    def __init__(self, folder: Path, fd: int | None) -> None:
        self.folder = folder
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)          # closing the descriptor drops the lock
            self._fd = None


def claim_folder(folder: Path, flag: str = "--out") -> FolderClaim:
    """Lock ``folder`` for this run; a TpusimError when another run holds it."""
    if fcntl is None:
        return FolderClaim(folder, None)
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise TpusimError(f"{flag} {str(folder)!r} is being written by another tpusim run right now; give "
                          f"this run its own {flag} (or wait for the other run to finish)") from None
    except OSError:                     # a file system without locks: run unlocked
        return FolderClaim(folder, fd)
    return FolderClaim(folder, fd)


def clear_earlier_run(folder: Path, files: tuple[str, ...], folders: tuple[str, ...] = ()) -> list[str]:
    """Remove an earlier run's ``files`` and ``folders`` (names tpusim writes) from a claimed ``folder``, so it
    holds one run's files: a rerun into the same --out wrote its report.json beside the old trace.json and
    figures, and the summary pointed at them. Nothing else in the folder is touched. Returns what went."""
    import shutil

    removed = []
    for name in files:
        path = folder / name
        if path.is_file() or path.is_symlink():
            path.unlink()
            removed.append(name)
    for name in folders:
        path = folder / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
            removed.append(name + "/")
    return removed


def claim_new_folder(base: Path) -> FolderClaim:
    """A fresh folder named ``base``, or ``base-2``, ``base-3``, ... when that name is taken (by an earlier
    run in the same second, or one running now), created and claimed."""
    prepare_folder(base.parent, "--out")
    for n in range(1, 1000):
        folder = base if n == 1 else base.with_name(f"{base.name}-{n}")
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        except OSError as error:
            raise TpusimError(f"cannot create the report folder {str(folder)!r}: {_why(error)}; "
                              f"choose one with --out") from None
        return claim_folder(folder)
    raise TpusimError(f"cannot find a free report folder name beside {str(base)!r}; choose one with --out")
