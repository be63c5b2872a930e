"""Real wall time of a script on the PJRT target, one fresh process per eager mode (the torch-free side).

``tpusim run --target pjrt`` prices its recording as always, then asks this module for the truth
to set beside the prediction:

- ``probe_device``: which device JAX has. It runs in a subprocess because on a TPU host only one
  process may hold the chips, and they must stay free for the measured runs.
  (Which tpusim chip a TPU's ``device_kind`` is comes from the chip files:
  ``tpusim.hardware.spec.chip_for_device_kind``, so the script is priced on the chip it really runs on.)
- ``measure_mode``: the script run for real in ``python -m tpusim.backend.device.measure_worker``
  with ``TPUSIM_TARGET=pjrt`` and ``TPUSIM_EAGER_MODE=<mode>``. A fresh process per mode starts
  every mode cold (its own jit caches) and records nothing, so no recording overhead distorts the
  clock. The script's stdout and stderr pass straight through; the worker writes its step times as
  JSON to a file that this side reads back.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from tpusim.errors import TpusimError
from tpusim.hardware.spec import ChipSpec
from tpusim.report.measured import JaxDevice, ModeRun

WORKER = "tpusim.backend.device.measure_worker"
INSTALL_HINT = 'pip install "jax[cpu]==0.10.2" (tpusim installs it: reinstall with pip install -e .)'
INTERRUPTED = 130                      # the exit code of a run stopped by Ctrl-C (as the shell reports it)
TIMED_OUT = 124                        # the exit code of a run stopped by --pjrt-timeout (as timeout(1) reports it)
STOP_GRACE_S = 10.0                    # how long a stopped worker gets to write its file before it is killed

_PROBE = ("import json, jax; d = jax.devices()[0]; print(json.dumps({'platform': d.platform, "
          "'device_kind': d.device_kind, 'jax_version': jax.__version__}))")


def require_jax() -> None:
    """Fail before anything runs when JAX is missing (a broken install): one line that says how to install it."""
    if not _jax_installed():
        raise TpusimError(f"--target pjrt runs the script through JAX, which is not installed: "
                          f"{INSTALL_HINT}")


def _jax_installed() -> bool:
    return importlib.util.find_spec("jax") is not None


def probe_device(timeout_s: float | None = 600.0) -> JaxDevice:
    """Ask JAX for its default device in a subprocess (so this process never holds a TPU)."""
    try:
        done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise TpusimError(f"JAX did not report its device within {timeout_s:.0f} s (--pjrt-timeout)") from None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        why = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        raise TpusimError(f"JAX could not start its device: {why} (JAX_PLATFORMS=cpu forces its CPU)")
    found = json.loads(lines[-1])
    return JaxDevice(str(found["platform"]), str(found["device_kind"]), str(found["jax_version"]))


def worker_env(mode: str, chip: ChipSpec, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a measured run: the PJRT target in ``mode`` on ``chip`` (the ChipSpec itself, so a
    chip loaded from a file works), handed over as the device's serialised config (``TPUSIM_DEVICE_CONFIG``,
    tpusim/backend/plumbing/config.py: fields not given take their defaults)."""
    env = dict(os.environ if base is None else base)
    config = {"chip": dataclasses.asdict(chip), "target": "pjrt", "eager_mode": mode, "numerics": True}
    env.update({"TPUSIM_DEVICE_CONFIG": json.dumps(config, sort_keys=True), "TPUSIM_EAGER_MODE": mode,
                "TPUSIM_TARGET": "pjrt"})          # as docs/compile-pjrt.md says; the script may read them
    return env


def measure_mode(script: Path, argv: list[str], mode: str, *, chip: ChipSpec, world: int = 1, chips_per_host: int = 1,
                 timeout_s: float | None = None) -> ModeRun:
    """Run ``script`` for real in ``mode`` in a fresh worker process and read back its step times.

    Never raises for what the script or the worker does: a script error, a crash, a timeout or
    Ctrl-C come back as a ModeRun with ``exit_code`` and ``error`` set (Ctrl-C: INTERRUPTED)."""
    with tempfile.TemporaryDirectory(prefix="tpusim-measure-") as tmp:
        result = Path(tmp) / f"{mode}.json"
        command = [sys.executable, "-m", WORKER, "--out", str(result), "--world", str(world),
                   "--chips-per-host", str(chips_per_host), "--", str(script), *argv]
        sys.stdout.flush()
        sys.stderr.flush()                  # our lines before the script's, in order
        process = subprocess.Popen(command, env=worker_env(mode, chip))
        try:
            code = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _stop(process)
            return ModeRun(mode, exit_code=TIMED_OUT, error_type="Timeout",
                           error=f"the {mode} run did not finish within {timeout_s:.0f} s and was stopped "
                                 f"(--pjrt-timeout sets the limit, 0 for none)\n")
        except KeyboardInterrupt:           # a terminal's Ctrl-C reached the worker too: let it finish first
            _stop(process, interrupted=True)
            run = _read(result, mode, INTERRUPTED)
            return run if run.exit_code == INTERRUPTED else ModeRun(
                mode, run.steps_s, run.total_s, INTERRUPTED, "KeyboardInterrupt", "KeyboardInterrupt\n",
                run.target_mode)
        return _read(result, mode, code)


def _stop(process: subprocess.Popen, interrupted: bool = False) -> None:
    """Stop the worker so that it still writes what it measured: Ctrl-C (unless it already had one),
    a grace period, then kill."""
    signals = [signal.SIGINT, signal.SIGKILL] if not interrupted else [None, signal.SIGINT, signal.SIGKILL]
    for sig in signals:
        if process.poll() is not None:
            return
        if sig is not None:
            process.send_signal(sig)
        try:
            process.wait(timeout=STOP_GRACE_S)
            return
        except subprocess.TimeoutExpired:
            pass


def _read(path: Path, mode: str, code: int) -> ModeRun:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return ModeRun(mode, exit_code=code or 1, error_type="WorkerFailed",
                       error=f"the {mode} run exited with code {code} before it wrote its measurements "
                             f"(its output is above)\n")
    return ModeRun(mode, tuple(float(s) for s in found["steps_s"]), found.get("total_s"),
                   int(found.get("exit_code", code)), found.get("error_type"), found.get("error"),
                   found.get("target_mode"))
