"""Where a run writes: the ``--out`` folder checked and claimed before the script runs, and every file
written atomically under a unique temporary name.

A file is written to ``.<name>.<pid>.<random>.tmp`` beside it and renamed over ``<name>`` only once it
is whole, so a crash, a kill -9 or Ctrl-C leaves either the old file or the new one, never half of one;
two processes writing the same name never share a temporary file. A run *claims* its folder with an
advisory lock (``flock`` on the folder itself, so nothing is left behind and a killed run releases it):
a second run into the same ``--out`` while the first is still writing is refused with one clear error
instead of mixing its files with the first run's. A run lists what it wrote in the folder's manifest
(``.tpusim-run.json``); a later run into the folder replaces or removes only what that manifest lists, once
it has written its own files, and refuses a folder holding files of its names that no run listed (the user's).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
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
        if out.is_symlink() and not out.exists():     # mkdir said "File exists" (issue 44, O06)
            raise TpusimError(f"{flag} {str(out)!r} is a broken symlink (to {os.readlink(out)!r}); give a folder, "
                              f"or create the folder it points to")
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


MANIFEST = ".tpusim-run.json"      # what a run wrote into its --out folder: the only files a later run may replace


@dataclass(frozen=True)
class EarlierRun:
    """What an earlier tpusim run's manifest lists in a folder and is there now: each file with its identity
    (device, inode, mtime) when this run claimed the folder, so a file rewritten since is told from a leftover;
    and each folder it wrote (``ranks``) with the files it wrote there."""

    files: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    folders: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def names(self) -> list[str]:
        return [*self.files, *(name + "/" for name in self.folders)]


def _identity(path: Path) -> tuple[int, int, int] | None:
    """A regular file's (device, inode, mtime), or None for anything else (a link, a folder, nothing)."""
    try:
        found = path.lstat()
    except OSError:
        return None
    return (found.st_dev, found.st_ino, found.st_mtime_ns) if stat.S_ISREG(found.st_mode) else None


def _real_folder(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink()


def _plain_names(names: object) -> list[str]:
    """File names of one folder (no path separators, no '.' or '..'), from a manifest; [] for anything else."""
    if not isinstance(names, list):
        return []
    return [n for n in names if isinstance(n, str) and n not in ("", ".", "..") and "/" not in n and "\0" not in n]


def _manifest(folder: Path) -> tuple[list[str], dict[str, list[str]]]:
    """The files and folders (each with its files) ``folder``'s manifest lists; none when there is no manifest
    or it is not one tpusim wrote (then nothing in the folder is tpusim's to replace)."""
    path = folder / MANIFEST
    try:
        if not stat.S_ISREG(path.lstat().st_mode):
            return [], {}
        found = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return [], {}
    if not isinstance(found, dict) or found.get("schema") != "tpusim-run":
        return [], {}
    folders = found.get("folders")
    return (_plain_names(found.get("files")),
            {name: _plain_names(files) for name, files in folders.items()} if isinstance(folders, dict) else {})


def earlier_run(folder: Path, files: tuple[str, ...], folders: tuple[str, ...] = ()) -> EarlierRun:
    """Which of ``files`` and ``folders`` (the names a run writes) an earlier run's manifest in ``folder`` lists
    and are still there (files as regular files, folders as real folders, never a link; in a folder, the
    regular files the manifest lists). A manifest naming anything else (edited, or crafted) is not believed
    for it: no other name is ever tpusim's to remove."""
    listed_files, listed_folders = _manifest(folder)
    identities = {name: _identity(folder / name) for name in files if name in listed_files}
    kept = {name: tuple(n for n in listed_folders[name] if _identity(folder / name / n) is not None)
            for name in folders if name in listed_folders and _real_folder(folder / name)}
    return EarlierRun({name: ident for name, ident in identities.items() if ident is not None}, kept)


def not_ours(folder: Path, names: tuple[str, ...], earlier: EarlierRun) -> list[str]:
    """Which of ``names`` (files or folders a run may write) are in ``folder`` and no tpusim run listed: the
    user's, never to be replaced."""
    ours = {*earlier.files, *earlier.folders}
    return [name for name in names if name not in ours and os.path.lexists(folder / name)]


def _remove_folder(path: Path, files: tuple[str, ...]) -> None:
    """An earlier run's folder: the files it wrote there, then the folder if that left it empty (anything
    else in it is not tpusim's)."""
    for name in files:
        with contextlib.suppress(OSError):
            (path / name).unlink()
    with contextlib.suppress(OSError):
        path.rmdir()


def finish_run(folder: Path, earlier: EarlierRun, names: tuple[str, ...], folders: tuple[str, ...] = ()) -> list[str]:
    """Once this run has written its files (those of ``names`` new or rewritten since the folder was claimed, and
    ``folders``, in place): remove the earlier run's files and folders this run did not write again, then list
    what this run wrote in the manifest, so the folder holds one run's files and a later run knows which are
    tpusim's. Nothing else in the folder is touched; when this run wrote nothing, nothing changes (the earlier
    run stays whole). Returns the earlier run's names, replaced or removed."""
    wrote = [name for name in names
             if _identity(folder / name) is not None and _identity(folder / name) != earlier.files.get(name)]
    wrote_folders = {name: sorted(n for n in os.listdir(folder / name) if _identity(folder / name / n) is not None)
                     for name in folders if _real_folder(folder / name)}
    if not wrote and not wrote_folders:
        return []
    for name, identity in earlier.files.items():
        if name not in wrote and _identity(folder / name) == identity:    # not written again: a leftover
            with contextlib.suppress(OSError):
                (folder / name).unlink()
    for name, files in earlier.folders.items():
        if name not in wrote_folders and _real_folder(folder / name):
            _remove_folder(folder / name, files)
    write_atomic(folder / MANIFEST, json.dumps({"schema": "tpusim-run", "files": wrote, "folders": wrote_folders},
                                               indent=1) + "\n")
    return earlier.names()


def move_into_place(staged: Path, folder: Path, name: str, earlier: EarlierRun) -> bool:
    """Rename the folder ``staged`` (written by this run) to ``folder/name``, in place of an earlier run's folder
    of that name (its files removed; never a folder no run listed, nor one holding files of the user's); False
    when such a folder is in the way."""
    target = folder / name
    if os.path.lexists(target):
        if name not in earlier.folders or not _real_folder(target):
            return False
        _remove_folder(target, earlier.folders[name])
        if os.path.lexists(target):               # files of the user's in it
            return False
    os.replace(staged, target)
    return True


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
