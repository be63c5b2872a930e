"""StableHLO through the real TPU compiler, deviceless: XLA's program, cached on disk, or one line why not.

Each compile runs ``python -m tpusim.xla.worker`` in a fresh process with the environment below: libtpu
then never asks a cloud metadata server for its TPU (there is none), prints nothing, and a module it
rejects (libtpu aborts the process on some) costs that process only. The chip file's ``xla_flags`` (what
published TPU runs pass libtpu: XLA's async collective fusion) are its LIBTPU_INIT_ARGS. Results are
cached by (module text, target, flags, jax and libtpu versions) under ~/.cache/tpusim/xla, shared by every
run and process: a program compiles once per machine. An entry carries its payload's sha256, and one that
does not match it (edited), is not of the shape written, or is not a regular file (a FIFO would block a read)
is compiled again and replaced. What cannot be compiled raises ``XlaUnavailable``
with the reason in words; callers fall back to tpusim's own model for that program and say so.
"""

from __future__ import annotations

import glob
import hashlib
import importlib.metadata
import importlib.util
import json
import math
import os
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path

from tpusim.hardware.spec import ChipSpec
from tpusim.output import cache_dir as _cache_root
from tpusim.output import write_atomic

EXTRA_HINT = 'pip install -e ".[xla]"'
TIMEOUT_S = 600.0                     # one compile; a GPT-3 175B block for 512 devices takes ~3 min here
WORKER = "tpusim.xla.worker"
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


def versions() -> str:
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


def _cached(text: str, target: XlaTarget) -> Compiled | None:
    """The cache's entry for this module and target, or None when there is none to believe: missing, not a
    regular file, cut short, of another shape, or not matching its checksum (an edited entry: its numbers are
    never priced). None compiles the module again, and its new entry replaces the bad one."""
    data = _read_regular(_cache_file(text, target))
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
    why = missing()
    if why:
        raise XlaUnavailable(why)
    found = _cached(text, target)
    if found is not None:
        return found
    result, seconds = _run_worker({"text": text}, target, timeout_s)
    return _keep(text, target, result, seconds)


def compile_many(texts: list[str], target: XlaTarget, *,
                 timeout_s: float = TIMEOUT_S) -> list[Compiled | XlaUnavailable]:
    """``compile_stablehlo`` of many small modules (eager ops' one-op programs): the uncached ones in one worker
    process (one libtpu start); per module, its program or why not."""
    why = missing()
    if why:
        return [XlaUnavailable(why)] * len(texts)
    results: list[Compiled | XlaUnavailable | None] = [_cached(text, target) for text in texts]
    todo = [i for i, found in enumerate(results) if found is None]
    if todo:
        try:
            answer, seconds = _run_worker({"texts": [texts[i] for i in todo]}, target, timeout_s)
            for i, result in zip(todo, answer["results"]):
                results[i] = (XlaUnavailable(f"the TPU compiler refused the program: {result['error']}")
                              if "error" in result else _keep(texts[i], target, result, seconds / len(todo)))
        except XlaUnavailable as failed:               # the worker died (libtpu aborted on one of them)
            for i in todo:
                results[i] = failed
    return [r if r is not None else XlaUnavailable("not compiled") for r in results]


def _run_worker(request: dict, target: XlaTarget, timeout_s: float) -> tuple[dict, float]:
    with tempfile.TemporaryDirectory(prefix="tpusim-xla-") as folder:
        request_file, result = Path(folder) / "request.json", Path(folder) / "result.json"
        request_file.write_text(json.dumps({**request, "topology": target.topology, "partitions": target.partitions}))
        began = time.perf_counter()
        try:
            done = subprocess.run([sys.executable, "-m", WORKER, str(request_file), str(result)],
                                  env={**os.environ, **QUIET_ENV, "LIBTPU_INIT_ARGS": target.flags},
                                  capture_output=True, text=True,
                                  timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise XlaUnavailable(f"the TPU compiler ran past {timeout_s:g} s") from None
        seconds = time.perf_counter() - began
        if done.returncode != 0 or not result.is_file():
            lines = [line for line in done.stderr.splitlines() if line.strip()]
            raise XlaUnavailable(f"the TPU compiler refused the program (exit {done.returncode}): "
                                 f"{lines[-1][:300] if lines else 'no message'}")
        return json.loads(result.read_text()), seconds
