"""``--ranks all``: one process per rank, their output prefixed by rank, all stopped when one fails.

The launcher hosts the TCPStore every rank connects to (torch's rendezvous through
TORCHELASTIC_USE_AGENT_STORE, and tpusim's control keys for hang detection), so no rank's exit
takes the store down. A rank that dies without saying why (a signal, ``os._exit``) is marked
``crashed`` in the store by the launcher, so its peers stop waiting at once; whatever still runs
``GRACE_S`` after the first failure is killed. The run ends with one diagnosis.

Ctrl-C: the ranks run in a session of their own, so the terminal's Ctrl-C reaches the launcher only;
it passes one SIGINT to every rank (each stops its script as ``python`` would and writes what it
recorded), waits ``GRACE_S`` for them, and kills the rest; a second Ctrl-C kills them at once. The
result says ``interrupted``, and the traces the ranks wrote are reported.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TextIO

import torch.distributed as dist

from tpusim.backend.distributed.control_store import SignedStore
from tpusim.backend.distributed.env import loopback_listener, torchrun_env

GRACE_S = 10.0


@dataclass
class LaunchResult:
    exit_codes: list[int]
    traces: list[Path]
    diagnosis: str = ""                         # the collective diagnosis, when ranks stopped on one
    crashed: dict[int, str] = field(default_factory=dict)   # rank -> what it died of
    killed: list[int] = field(default_factory=list)          # ranks the launcher had to stop
    interrupted: bool = False                   # Ctrl-C (SIGINT) reached the launcher, or SIGTERM/SIGHUP
    signal: int = signal.SIGINT                 # which one (tpusim/script.py raises the other two as Ctrl-C)

    @property
    def ok(self) -> bool:
        return not any(self.exit_codes) and not self.diagnosis and not self.interrupted

    def summary(self) -> str:
        """One error for the whole run ('' when it succeeded)."""
        if self.interrupted:
            stopped = f"; ranks {','.join(map(str, self.killed))} did not stop in time and were killed" \
                if self.killed else ""
            by = "Ctrl-C" if self.signal == signal.SIGINT else signal.Signals(self.signal).name
            return f"tpusim: interrupted ({by}): every rank was stopped{stopped}"
        if self.diagnosis:
            return self.diagnosis
        if self.crashed:
            crashed = "; ".join(f"rank {r} crashed: {why}" for r, why in sorted(self.crashed.items()))
            stopped = f"; ranks {','.join(map(str, self.killed))} were stopped" if self.killed else ""
            return f"tpusim: {crashed}{stopped}"
        failed = [r for r, c in enumerate(self.exit_codes) if c]
        return f"tpusim: ranks {failed} exited with codes {[self.exit_codes[r] for r in failed]}" if failed else ""


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def launch(script: str | Path, argv: list[str], world: int, chips_per_host: int, out_dir: Path,
           env: dict[str, str] | None = None, stream: TextIO | None = None, grace_s: float = GRACE_S) -> LaunchResult:
    """Run ``script`` as ``world`` rank processes; return how each ended and where its trace is."""
    out = stream or sys.stdout
    out_dir.mkdir(parents=True, exist_ok=True)
    listener = loopback_listener()
    port = listener.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=60), master_listen_fd=listener.fileno())
    token = secrets.token_hex(16)           # signs the control values: this run's ranks alone know it (never stored)
    control = SignedStore(store, token)
    lock = threading.Lock()
    procs, readers, traces = [], [], []
    result = LaunchResult(exit_codes=[0] * world, traces=traces)
    try:
        for rank in range(world):
            trace = out_dir / f"rank{rank}.jsonl"
            traces.append(trace)
            child_env = {**os.environ, **(env or {}), **torchrun_env(rank, world, chips_per_host, "all", port),
                         "TORCHELASTIC_USE_AGENT_STORE": "True", "TPUSIM_CONTROL": f"127.0.0.1:{port}",
                         "TPUSIM_CONTROL_TOKEN": token,
                         "TPUSIM_LAUNCHED": "1", "PYTHONUNBUFFERED": "1"}
            proc = subprocess.Popen([sys.executable, "-m", "tpusim.backend.distributed.worker", "--trace",
                                     str(trace), str(script), *argv], env=child_env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True)
            procs.append(proc)
            reader = threading.Thread(target=_pump, args=(proc, rank, out, lock), daemon=True)
            reader.start()
            readers.append(reader)
    except KeyboardInterrupt:               # Ctrl-C while the ranks start: those started stop as below
        result.interrupted = True
        del result.exit_codes[len(procs):], traces[len(procs):]
        _interrupt(procs, set(range(len(procs))))
    _watch(procs, control, result, grace_s)
    for reader in readers:
        reader.join(timeout=5)
    diagnosis = control.read("diagnosis")
    if diagnosis is not None:
        result.diagnosis = diagnosis.decode()
    del store
    listener.close()
    return result


def _pump(proc: subprocess.Popen, rank: int, out: TextIO, lock: threading.Lock) -> None:
    for line in proc.stdout:
        with lock:
            out.write(f"[rank {rank}] {line}" if line.endswith("\n") else f"[rank {rank}] {line}\n")
            out.flush()


def _interrupt(procs: list[subprocess.Popen], running: set[int]) -> None:
    """Pass Ctrl-C on to the ranks still running (they run in a session of their own)."""
    for rank in sorted(running):
        try:
            procs[rank].send_signal(signal.SIGINT)
        except ProcessLookupError:
            pass


def _watch(procs: list[subprocess.Popen], control: SignedStore, result: LaunchResult, grace_s: float) -> None:
    """Wait for every rank; after the first failure (or Ctrl-C) give the others ``grace_s`` to stop, then
    kill them; a second Ctrl-C kills them at once."""
    deadline = time.monotonic() + grace_s if result.interrupted else None
    running = set(range(len(procs)))
    while running:
        try:
            deadline = _poll(procs, control, result, running, deadline, grace_s)
            time.sleep(0.05)
        except KeyboardInterrupt as stop:
            if result.interrupted:
                deadline = time.monotonic()         # pressed again: stop waiting
                continue
            result.interrupted = True
            result.signal = getattr(stop, "signum", signal.SIGINT)
            _interrupt(procs, running)
            deadline = time.monotonic() + grace_s


def _poll(procs: list[subprocess.Popen], control: SignedStore, result: LaunchResult, running: set[int],
          deadline: float | None, grace_s: float) -> float | None:
    """One look at the ranks still running; returns the (maybe new) deadline for the rest."""
    for rank in sorted(running):
        code = procs[rank].poll()
        if code is None:
            continue
        running.discard(rank)
        result.exit_codes[rank] = code
        if code == 0 or result.interrupted:
            continue
        key = f"status/{rank}"
        value = control.read(key)
        status = json.loads(value) if value is not None else {}
        if status.get("state") == "crashed":
            result.crashed[rank] = status.get("detail", "")
        elif status.get("state") != "failed":
            why = _describe_exit(code)
            result.crashed[rank] = why
            control.set(key, json.dumps({"state": "crashed", "detail": why, "last": status.get("last", "")}))
        if deadline is None:
            deadline = time.monotonic() + grace_s
    if deadline is not None and running and time.monotonic() > deadline:
        for rank in sorted(running):
            procs[rank].kill()
            procs[rank].wait()
            result.exit_codes[rank] = procs[rank].returncode
            result.killed.append(rank)
        running.clear()
    return deadline
