"""StableHLO through the real TPU compiler, deviceless: XLA's program, cached on disk, or one line why not.

Compiles run in worker processes (``python -m tpusim.xla.worker --serve``) with the environment below: libtpu
then never asks a cloud metadata server for its TPU (there is none), prints nothing, and a module it
rejects (libtpu aborts the process on some) costs that process and that module only. The chip file's
``xla_flags`` (what published TPU runs pass libtpu: XLA's async collective fusion) are its LIBTPU_INIT_ARGS.
``compile_all`` compiles a run's distinct uncached programs on a bounded pool of such workers, one per core
by default: each worker starts jax and libtpu once (about 2 s) and then compiles program after program, and a
worker that dies is replaced for the programs after the one that killed it. Results are
cached by (module text, target, flags, jax and libtpu versions) under ~/.cache/tpusim/xla, shared by every
run and process: a program compiles once per machine. An entry carries its payload's sha256, and one that
does not match it (edited), is not of the shape written, or is not a regular file (a FIFO would block a read)
is compiled again and replaced. What cannot be compiled raises ``XlaUnavailable``
with the reason in words; callers fall back to tpusim's own model for that program and say so.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import importlib.metadata
import importlib.util
import json
import math
import os
import queue
import select
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from tpusim.hardware.spec import ChipSpec
from tpusim.output import cache_dir as _cache_root
from tpusim.output import write_atomic

EXTRA_HINT = 'pip install -e ".[xla]"'
TIMEOUT_S = 600.0                     # one compile; a GPT-3 175B block for 512 devices takes ~3 min here
WORKER = "tpusim.xla.worker"
# one worker process: it answers one JSON line per JSON line it reads (tests swap in a fake worker here)
WORKER_COMMAND: list[str] = [sys.executable, "-m", WORKER, "--serve"]
# libtpu on a machine with no TPU (measured with jax 0.10.2, libtpu 0.0.52: with these, a compile prints
# nothing and opens no connection; the accelerator type only quiets a warning, the program is the same for
# any valid value)
QUIET_ENV = {
    "TPU_SKIP_MDS_QUERY": "1",                # never ask the cloud metadata server
    "TPU_ACCELERATOR_TYPE": "v5p-16",         # any valid type: "could not determine TPU accelerator type"
    "TPU_WORKER_HOSTNAMES": "localhost",      # "unexpected worker hostname" before InitGoogle
    "TPU_WORKER_ID": "0",
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",        # libtpu's one-process lock guards chips; a deviceless compile has none
}
# the process that runs the script: JAX on its CPU (JAX would otherwise load libtpu, look for a TPU, warn)
PROCESS_ENV = {**QUIET_ENV, "JAX_PLATFORMS": "cpu"}


def tpu_attached() -> bool:
    """Whether this machine has TPU chips (TPU VMs expose them as /dev/accel* or /dev/vfio/<n>)."""
    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def quiet_libtpu(environ: MutableMapping[str, str] = os.environ) -> None:
    """With the xla extra installed on a machine without TPU chips, any jax in this process would find
    libtpu, look for a TPU and print libtpu's warnings: JAX on the CPU and libtpu quiet, where unset."""
    if importlib.util.find_spec("libtpu") is not None and not tpu_attached():
        for name, value in PROCESS_ENV.items():
            environ.setdefault(name, value)


class XlaUnavailable(Exception):
    """Why the TPU compiler did not price a program, in one line a user reads."""


@dataclass(frozen=True)
class XlaTarget:
    """What a program is compiled for: libtpu's name of the slice, and how many devices share the program."""

    chip: str
    topology: str                      # "v5p:2x2x1"
    partitions: int
    clock_hz: float                    # XLA's estimated cycles are the chip's clock cycles
    flags: str = ""                    # LIBTPU_INIT_ARGS of the compile (the chip file's xla_flags)


@dataclass(frozen=True)
class Compiled:
    """XLA's optimized, scheduled program and what the compiled executable says about it."""

    hlo: str
    memory: dict[str, int]             # the compiled memory stats: argument, output, temp, peak bytes
    cost: dict[str, float]             # XLA's cost analysis: flops, bytes accessed, ...
    compile_s: float                   # wall time of the compile (of the first one, when cached)
    cached: bool = False


def missing() -> str | None:
    """Why the TPU compiler cannot run here, or None when it can."""
    for package in ("jax", "libtpu"):
        if importlib.util.find_spec(package) is None:
            return (f"{package} is not installed; the xla extra ({EXTRA_HINT}) prices each program as the real "
                    f"TPU compiler builds it")
    return None


@functools.cache
def versions() -> str:
    """The versions in every cache key (read once per process: reading package metadata costs ~2 ms a call)."""
    return ", ".join(f"{name} {importlib.metadata.version(name)}" for name in ("jax", "jaxlib", "libtpu"))


# Virtual slices a program is compiled on, smallest first, per torus rank: the first that holds the program's
# devices is used (its first devices). Adding a size = one entry here.
SLICE_SHAPES = {
    2: ("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"),
    3: ("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8", "8x8x16", "8x16x16", "16x16x16"),
}


def target_for(chip: ChipSpec, partitions: int = 1) -> XlaTarget:
    """The smallest virtual slice of ``chip`` that holds ``partitions`` devices (one chip's program: one)."""
    if not chip.xla_topology_name:
        raise XlaUnavailable(f"the TPU compiler has no target for chip {chip.name} (its chip file names no "
                             f"xla_topology_name)")
    shapes = SLICE_SHAPES.get(chip.torus_dims, ())
    shape = next((s for s in shapes if math.prod(int(d) for d in s.split("x")) >= partitions), None)
    if shape is None:
        raise XlaUnavailable(f"no virtual {chip.name} slice here holds a program over {partitions} devices")
    return XlaTarget(chip.name, f"{chip.xla_topology_name}:{shape}", partitions, chip.clock_hz, chip.xla_flags)


def cache_dir() -> Path:
    return _cache_root("xla")


def _cache_file(text: str, target: XlaTarget) -> Path:
    identity = f"{target.topology}|{target.partitions}|{target.flags}|{versions()}\n{text}"
    return cache_dir() / f"{hashlib.sha256(identity.encode()).hexdigest()[:32]}.json"


def _read_regular(path: Path) -> bytes | None:
    """A regular file's bytes, else None: never opens anything else for reading (a FIFO at the name would block
    for ever; O_NONBLOCK opens it at once, and fstat says what it is)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with open(fd, "rb", closefd=False) as handle:
            return handle.read()
    except OSError:
        return None
    finally:
        os.close(fd)


def _real(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _number(value: object) -> bool:
    return _real(value) and math.isfinite(value)


def _entry(found: object) -> Compiled | None:
    """A cache entry's payload as a ``Compiled``, or None when it is not of the shape ``_keep`` writes."""
    if not isinstance(found, dict):
        return None
    hlo, memory, cost, seconds = (found.get(key) for key in ("hlo", "memory", "cost", "compile_s"))
    if not (isinstance(hlo, str) and "ENTRY" in hlo and isinstance(memory, dict) and isinstance(cost, dict)
            and all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in memory.items())
            and all(isinstance(k, str) and _real(v) for k, v in cost.items()) and _number(seconds)):
        return None
    return Compiled(hlo, memory, cost, float(seconds), cached=True)


def _cached_at(entry: Path) -> Compiled | None:
    """The cache's entry at ``entry``, or None when there is none to believe: missing, not a
    regular file, cut short, of another shape, or not matching its checksum (an edited entry: its numbers are
    never priced). None compiles the module again, and its new entry replaces the bad one."""
    data = _read_regular(entry)
    digest, _, payload = (data or b"").partition(b"\n")
    if not payload or hashlib.sha256(payload).hexdigest().encode() != digest:
        return None
    try:
        return _entry(json.loads(payload.decode("utf-8")))
    except (ValueError, RecursionError):
        return None


def _keep(text: str, target: XlaTarget, result: dict, seconds: float) -> Compiled:
    """The worker's result as a ``Compiled``, kept in the cache: the payload's sha256 on the first line, then
    the payload (``_cached`` believes an entry only when the two agree)."""
    compiled = Compiled(result["hlo"], result["memory"], result["cost"], seconds)
    payload = json.dumps({"hlo": compiled.hlo, "memory": compiled.memory, "cost": compiled.cost,
                          "compile_s": seconds}).encode()
    try:
        cached = _cache_file(text, target)
        cached.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(cached, hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)
    except OSError:                                     # a read-only home, a folder at the name: compiled, not kept
        pass
    return compiled


def compile_stablehlo(text: str, target: XlaTarget, *, timeout_s: float = TIMEOUT_S) -> Compiled:
    """XLA's program for the StableHLO module ``text`` on ``target``: from the cache, else compiled now."""
    result = compile_all([(text, target)], timeout_s=timeout_s)[0]
    if isinstance(result, XlaUnavailable):
        raise result
    return result


def compile_many(texts: list[str], target: XlaTarget, *,
                 timeout_s: float = TIMEOUT_S) -> list[Compiled | XlaUnavailable]:
    """``compile_stablehlo`` of many modules for one target (``compile_all``): per module, its program or why not."""
    return compile_all([(text, target) for text in texts], timeout_s=timeout_s)


WORKER_MEMORY_BYTES = 2 << 30         # a worker's share of memory: ~0.5 GB measured on small programs, more on big


def default_workers() -> int:
    """Worker processes compiling at once: the cores this process may run on, no more than memory holds."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:                              # no sched_getaffinity (macOS)
        cores = os.cpu_count() or 1
    return max(1, min(cores, _available_memory() // WORKER_MEMORY_BYTES))


def _available_memory() -> int:
    """The memory free for new processes (Linux's MemAvailable), or no limit where it cannot be read."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return sys.maxsize


def compile_all(jobs: Sequence[tuple[str, XlaTarget]], *, workers: int | None = None,
                timeout_s: float = TIMEOUT_S,
                progress: Callable[[int, int], None] | None = None) -> list[Compiled | XlaUnavailable]:
    """XLA's program for each (module, target), or why not: each distinct module compiled once (the cache first;
    the rest on ``workers`` worker processes at once, ``default_workers()`` when None). ``progress(done, total)``
    hears (0, total) before the first compile and each one's end after, ``total`` counting the uncached only."""
    why = missing()
    if why:
        return [XlaUnavailable(why)] * len(jobs)
    keys = [_cache_file(text, target) for text, target in jobs]
    results: dict[Path, Compiled | XlaUnavailable] = {}
    todo: dict[Path, tuple[str, XlaTarget]] = {}
    for key, job in zip(keys, jobs):
        if key not in results and key not in todo:
            found = _cached_at(key)
            if found is not None:
                results[key] = found
            else:
                todo[key] = job
    if todo:
        results.update(_compile_on_pool(todo, workers or default_workers(), timeout_s, progress))
    return [results[key] for key in keys]


def _compile_on_pool(todo: dict[Path, tuple[str, XlaTarget]], workers: int, timeout_s: float,
                     progress: Callable[[int, int], None] | None) -> dict[Path, Compiled | XlaUnavailable]:
    """Compile every module of ``todo`` on up to ``workers`` worker processes, the largest first (the pool then
    ends close together); the main thread only waits and reports progress, so Ctrl-C stops it, and every worker
    is ended on the way out."""
    order = sorted(todo, key=lambda key: (todo[key][1].flags, -len(todo[key][0])))
    waiting: queue.SimpleQueue[Path] = queue.SimpleQueue()
    for key in order:
        waiting.put(key)
    finished: queue.SimpleQueue[Path] = queue.SimpleQueue()
    results: dict[Path, Compiled | XlaUnavailable] = {}
    pool = [_Worker() for _ in range(min(workers, len(order)))]

    def drain(worker: _Worker) -> None:
        while True:
            try:
                key = waiting.get_nowait()
            except queue.Empty:
                return
            text, target = todo[key]
            try:
                result, seconds = worker.compile(text, target, timeout_s)
                results[key] = (XlaUnavailable(f"the TPU compiler refused the program: {result['error']}")
                                if "error" in result else _keep(text, target, result, seconds))
            except XlaUnavailable as why:
                results[key] = why
            except Exception as error:  # noqa: BLE001 - a bug here must not hang the run: this program falls back
                results[key] = XlaUnavailable(f"the TPU compiler's worker failed ({type(error).__name__}: {error})"
                                              [:300])
            finished.put(key)

    threads = [threading.Thread(target=drain, args=(worker,), daemon=True) for worker in pool]
    try:
        if progress:
            progress(0, len(order))
        for thread in threads:
            thread.start()
        for done in range(1, len(order) + 1):
            finished.get()
            if progress:
                progress(done, len(order))
    finally:
        for worker in pool:                              # done, or stopped: a worker still compiling is killed
            worker.stop()
        for thread in threads:
            thread.join(timeout=5)
        for worker in pool:
            worker.release()
    return results


class _Worker:
    """One worker process that compiles module after module (``tpusim.xla.worker --serve``), for one set of libtpu
    flags (they are read when libtpu starts): started at its first module, started again after it died (a module
    libtpu aborted on, or one that ran past its time), or when a module with other flags comes."""

    def __init__(self) -> None:
        self._process: subprocess.Popen | None = None
        self._errors: IO[bytes] | None = None      # the process's stderr: its last line says why it died
        self._flags = ""
        self._lock = threading.Lock()
        self._closed = False

    def _start(self, flags: str) -> subprocess.Popen:
        self._end()
        self._errors = tempfile.TemporaryFile(prefix="tpusim-xla-")
        with self._lock:
            if self._closed:
                raise XlaUnavailable("stopped before the TPU compiler ran")
            self._process = subprocess.Popen(WORKER_COMMAND, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                             stderr=self._errors,
                                             env={**os.environ, **QUIET_ENV, "LIBTPU_INIT_ARGS": flags})
        self._flags = flags
        return self._process

    def compile(self, text: str, target: XlaTarget, timeout_s: float) -> tuple[dict, float]:
        """The worker's answer for ``text`` (XLA's program, or {"error": why} for a module XLA refused) and the
        seconds it took; ``XlaUnavailable`` when the worker died on it or ran past ``timeout_s``."""
        process = self._process
        if process is None or process.poll() is not None or self._flags != target.flags:
            process = self._start(target.flags)
        request = json.dumps({"text": text, "topology": target.topology, "partitions": target.partitions})
        began = time.perf_counter()
        try:
            process.stdin.write(request.encode() + b"\n")
            process.stdin.flush()
            line = _read_line(process.stdout.fileno(), began + timeout_s)
        except BrokenPipeError:
            line = b""
        except TimeoutError:
            self._end()
            raise XlaUnavailable(f"the TPU compiler ran past {timeout_s:g} s") from None
        if not line:
            raise XlaUnavailable(self._died())
        return json.loads(line), time.perf_counter() - began

    def _died(self) -> str:
        """Why the worker ended without an answer, in the words of its last line on stderr."""
        process = self._process
        try:
            code = process.wait(timeout=10) if process is not None else None
        except subprocess.TimeoutExpired:
            code = None
        errors = ""
        if self._errors is not None:
            self._errors.seek(0)
            errors = self._errors.read().decode(errors="replace")
        self._end()
        lines = [line for line in errors.splitlines() if line.strip()]
        return f"the TPU compiler refused the program (exit {code}): {lines[-1][:300] if lines else 'no message'}"

    def _end(self) -> None:
        with self._lock:
            process, self._process = self._process, None
        if process is not None:
            if process.poll() is None:
                process.kill()
            process.wait()
            for pipe in (process.stdin, process.stdout):
                try:
                    pipe.close()
                except OSError:                          # the pipe broke when the worker died
                    pass
        if self._errors is not None:
            self._errors.close()
            self._errors = None

    def stop(self) -> None:
        """Kill the worker process, for good (it may be compiling: the run is stopping); the thread that owns it
        then reads the end of its output and ends."""
        with self._lock:
            self._closed = True
            if self._process is not None and self._process.poll() is None:
                self._process.kill()

    def release(self) -> None:
        """The stopped worker's pipes and files closed (after its thread ended)."""
        self._end()


def _read_line(fd: int, deadline: float) -> bytes:
    """One line from ``fd`` (b"" at end of file), or ``TimeoutError`` past ``deadline`` (perf_counter time)."""
    chunks: list[bytes] = []
    while True:
        left = deadline - time.perf_counter()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise TimeoutError
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b""
        chunks.append(chunk)
        if chunk.endswith(b"\n"):
            return b"".join(chunks)
