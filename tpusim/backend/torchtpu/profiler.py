"""torch_tpu's ``_internal.profiler``: ``profile``, ``ProfilerActivity`` and ``xprof_trace_handler`` on tpusim.

    with profiler.profile(activities=[profiler.ProfilerActivity.CPU, profiler.ProfilerActivity.TPU],
                          on_trace_ready=profiler.xprof_trace_handler(dir_name="/tmp/profile")):
        train()

TorchTPU's ``profile`` asks its handler for a directory before the block and writes XProf's
``<dir>/plugins/profile/<timestamp>/<host>.xplane.pb`` after it. tpusim has no XProf; in the same
folder it writes, after the block:

- ``<host>.pt.trace.json``: torch.profiler's Chrome trace of the block's host side (every op the script
  dispatched, tpu ones included, with host times), for ui.perfetto.dev or chrome://tracing;
- under a recording (``tpusim run``), ``<host>.tpusim.trace.json`` too: the block's recorded ops priced on
  one simulated chip of the run's generation in the current eager mode, in the format of the trace.json
  ``tpusim run`` writes (tpusim/report/perfetto.py): the simulated TPU timeline XProf's device trace would
  show. (The run's own trace.json prices the whole program on the run's slice.)

``worker_rank`` (``xprof_trace_handler``'s) joins the file names. ``dir_name`` may be left out when
TORCH_TPU_PROFILER_OUTPUT_DIR names the folder. GPU activity raises, as in TorchTPU.
"""

from __future__ import annotations

import contextlib
import datetime
import enum
import json
import os
import socket
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from tpusim.backend.plumbing.state import STATE
from tpusim.backend.program_trace import recorder
from tpusim.eager import state as eager
from tpusim.errors import TpusimError
from tpusim.output import write_atomic

OUTPUT_DIR_ENV = "TORCH_TPU_PROFILER_OUTPUT_DIR"


class ProfilerActivity(enum.Enum):
    """What to profile (TorchTPU's members): the host (CPU), the device (TPU); GPU is refused."""

    CPU = 1
    TPU = 2
    GPU = 3


def xprof_trace_handler(dir_name: str | os.PathLike | None = None,
                        worker_rank: str | int | None = None) -> Callable[[Any], str]:
    """The ``on_trace_ready`` handler naming the folder the traces go to (TorchTPU's: it returns the folder)."""
    folder = dir_name if dir_name is not None else os.environ.get(OUTPUT_DIR_ENV, "").strip()
    if not folder:
        raise TpusimError(f"xprof_trace_handler: give dir_name, or set {OUTPUT_DIR_ENV} to a folder")

    def handler(prof: object) -> str:
        return str(folder)

    handler.worker_rank = worker_rank  # type: ignore[attr-defined]
    return handler


def _activities(activities: list | None) -> list[ProfilerActivity]:
    if activities is None:
        warnings.warn("profiler.profile: no activities given; profiling CPU and TPU", stacklevel=4)
        return [ProfilerActivity.CPU, ProfilerActivity.TPU]
    if ProfilerActivity.GPU in activities:
        raise TpusimError("profiler.profile: GPU profiling is not supported (TorchTPU's rule): profile CPU and TPU")
    return list(activities)


@contextlib.contextmanager
def profile(activities: list[ProfilerActivity] | None = None, on_trace_ready: Callable[[Any], str] | None = None,
            **kwargs: object) -> Iterator[None]:
    """Profile the block and write its traces into the handler's folder (see the module docstring); yields
    None, as TorchTPU's does. Other keyword arguments are accepted and change nothing."""
    if not on_trace_ready:
        raise TpusimError("profiler.profile: on_trace_ready must be given (profiler.xprof_trace_handler(dir_name=...))")
    _activities(activities)
    folder = Path(on_trace_ready(None))
    rank = getattr(on_trace_ready, "worker_rank", None)
    first = len(recorder.recorded())
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as host:
        yield None
    records = recorder.recorded()[first:]
    stamp = datetime.datetime.now().strftime("%Y_%m_%d_%H_%M_%S")
    out = folder / "plugins" / "profile" / stamp
    out.mkdir(parents=True, exist_ok=True)
    name = (socket.gethostname() or "localhost") + (f".{rank}" if rank is not None else "")
    host.export_chrome_trace(str(out / f"{name}.pt.trace.json"))
    if records:
        write_atomic(out / f"{name}.tpusim.trace.json", json.dumps(simulated_trace(records)))


def simulated_trace(records: list) -> dict[str, Any]:
    """``records`` (ops and host events of a recording) priced on one chip of the device's generation in the
    current eager mode, as ``tpusim run``'s trace.json (tpusim/report/perfetto.py)."""
    from tpusim.eager.modes import get_mode
    from tpusim.pricing import price, single_chip_topology
    from tpusim.report.perfetto import perfetto_trace
    from tpusim.slice.topology import build_slice
    from tpusim.trace.records import Trace, TraceMeta, renumber

    chip = STATE.config.chip
    kept = [r for r in records if r.kind in ("op", "host")]
    trace = Trace(records=renumber(kept), meta=TraceMeta(device="tpu", chip=chip.name, devices=1))
    mode = eager.get_eager_mode()
    one_chip = build_slice(single_chip_topology(chip), chip=chip)
    return perfetto_trace(price(trace, topology=one_chip, mode=get_mode(mode)), mode)


__all__ = ["OUTPUT_DIR_ENV", "ProfilerActivity", "profile", "simulated_trace", "xprof_trace_handler"]
