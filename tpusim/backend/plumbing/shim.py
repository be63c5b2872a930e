"""Compile (once) and load the C++ shim in tpusim/backend/csrc/.

Why at first import and not at ``pip install``: the shim must be built against the torch that
is imported, never against a second copy pip would fetch into an isolated build environment.
The build is cached under ``$TORCH_EXTENSIONS_DIR/tpusim`` (else ``~/.cache/tpusim``) in a folder
named by a hash of the sources and the torch/Python versions, so it is rebuilt only when one of
those changes; later imports load the cached library directly (no compiler, no ninja).
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path
from types import ModuleType

import torch

CSRC = Path(__file__).resolve().parents[1] / "csrc"
UNITS = ("unit_aten.cpp", "unit_python.cpp")  # each includes several of csrc/'s files: fewer parses of torch's headers


def cache_root() -> Path:
    """Where builds go: TORCH_EXTENSIONS_DIR/tpusim, else ~/.cache/tpusim."""
    base = os.environ.get("TORCH_EXTENSIONS_DIR")
    return Path(base) / "tpusim" if base else Path.home() / ".cache" / "tpusim"


def _digest() -> str:
    h = hashlib.sha256()
    h.update(f"{torch.__version__}|{sys.version_info[:2]}|{sysconfig.get_platform()}".encode())
    for path in sorted(CSRC.glob("*.[ch]*")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:12]


def _import_file(name: str, path: Path) -> ModuleType:
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, str(path), loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sys.modules[name] = module
    return module


def load() -> ModuleType:
    """The compiled shim module; builds it first if this source version was never built here."""
    digest = _digest()
    name = f"tpusim_shim_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    build_dir = cache_root() / f"shim-{digest}"
    library = build_dir / f"{name}.so"
    done_marker = build_dir / "ok"
    if library.exists() and done_marker.exists():
        return _import_file(name, library)
    build_dir = _writable(build_dir)
    library, done_marker = build_dir / f"{name}.so", build_dir / "ok"
    if library.exists() and done_marker.exists():
        return _import_file(name, library)
    # one build at a time (pytest -n, --ranks all): the others wait, then load it (torch's own baton is "lock")
    with open(build_dir / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if library.exists() and done_marker.exists():
            return _import_file(name, library)
        return _build(name, build_dir, done_marker)


def _writable(build_dir: Path) -> Path:
    """``build_dir``, created; where it cannot be (a read-only home: issue 32, row 9, a raw PermissionError at
    ``import torch``), the same folder under this user's temporary directory, with one line saying so."""
    try:
        build_dir.mkdir(parents=True, exist_ok=True)
        return build_dir
    except OSError as error:
        fallback = Path(tempfile.gettempdir()) / f"tpusim-{os.getuid()}" / build_dir.name
        if not (fallback / "ok").exists():         # said once, when it builds there
            print(f"tpusim: cannot write the shim cache {build_dir.parent} ({error.strerror}); building in "
                  f"{fallback} (set TORCH_EXTENSIONS_DIR to a writable folder to keep it)", file=sys.stderr)
        try:
            fallback.mkdir(parents=True, exist_ok=True)
        except OSError as second:
            raise RuntimeError(f"tpusim: no writable folder for the tpu device shim ({build_dir.parent}: "
                               f"{error.strerror}; {fallback.parent}: {second.strerror}); set "
                               f"TORCH_EXTENSIONS_DIR to a writable folder") from None
        return fallback


def _no_cuda_note(record: logging.LogRecord) -> bool:
    """False for cpp_extension's "No CUDA runtime is found" warning: the shim is CPU code, and with PyPI's
    torch (CUDA libraries installed, no GPU) a new user's first run printed it above the build line."""
    return not record.getMessage().startswith("No CUDA runtime is found")


def _build(name: str, build_dir: Path, done_marker: Path) -> ModuleType:
    extension_log = logging.getLogger("torch.utils.cpp_extension")
    extension_log.addFilter(_no_cuda_note)      # while it is imported (the warning comes at import), then gone
    try:
        from torch.utils import cpp_extension  # only when building: it pulls in setuptools, slow at `import torch`
    finally:
        extension_log.removeFilter(_no_cuda_note)

    log = build_dir / "build.log"
    print("tpusim: compiling the tpu device shim, once per torch version (about 30 s on 2 idle cores)...", end="",
          file=sys.stderr, flush=True)
    start = time.perf_counter()
    ticking = threading.Event()
    threading.Thread(target=_tick, args=(ticking, start), daemon=True).start()
    try:
        module = cpp_extension.load(
            name=name,
            sources=[str(CSRC / unit) for unit in UNITS],
            extra_include_paths=[str(CSRC)],
            extra_cflags=["-O2", "-Wno-unused-parameter"],
            build_directory=str(build_dir),
            verbose=False,
        )
    except Exception as err:  # compiler missing, headers mismatch, ...
        ticking.set()
        log.write_text(f"{type(err).__name__}: {err}\n")
        print(" failed", file=sys.stderr, flush=True)
        compiler = os.environ.get("CXX", "c++")
        errors = [line for line in str(err).splitlines() if "error" in line.lower()][:5]
        raise RuntimeError(
            f"tpusim: could not compile the tpu device shim with {compiler!r} (torch {torch.__version__}). "
            f"Build log: {log}. Fix: install a C++17 compiler (gcc >= 9) and ninja, or point CXX at one; "
            f"set TORCH_EXTENSIONS_DIR to build elsewhere. First errors:\n" + "\n".join(errors)
        ) from err
    ticking.set()
    done_marker.write_text(f"built in {time.perf_counter() - start:.1f} s\n")
    print(f" done in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    return module


def _tick(done: threading.Event, start: float) -> None:
    """The elapsed time every 15 s while the shim compiles, so a long first build is not a silent one."""
    while not done.wait(15.0):
        print(f" {time.perf_counter() - start:.0f} s...", end="", file=sys.stderr, flush=True)
