"""Run a sweep's points on Dask: one task per point, results streaming back as they finish.

Where the cluster comes from: ``--scheduler tcp://host:port`` (or DASK_SCHEDULER_ADDRESS) for an existing
one, else an embedded ``LocalCluster`` of worker processes (pricing is pure Python: threads would share
one GIL). A task that raises is retried (``retries``); a point whose worker keeps dying ends as
``KilledWorker``: either way it becomes a row with status "failed" and the error, never a silently
missing row. The trace is one task every point depends on (sent to each worker once), so workers that
die take no other point with them.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from tpusim.errors import TpusimError
from tpusim.sweep.grid import Point
from tpusim.sweep.point import point_slice, price_point
from tpusim.trace.records import Trace

SCHEDULER_ENV = "DASK_SCHEDULER_ADDRESS"


def scheduler_address(given: str | None) -> str | None:
    """--scheduler, else DASK_SCHEDULER_ADDRESS, else None (an embedded LocalCluster)."""
    return given or os.environ.get(SCHEDULER_ENV) or None


def require_dask() -> None:
    """One TpusimError when Dask is not installed: asked before any recording or progress bar starts, so a sweep
    that cannot price says so first, not after an empty bar (or minutes of recording)."""
    try:
        import distributed  # noqa: F401
    except ImportError:
        raise TpusimError("tpusim sweep needs Dask: pip install -e '.[sweep]' (dask[distributed], pandas, "
                          "pyarrow)") from None


@contextmanager
def dask_client(scheduler: str | None = None, workers: int | None = None) -> Iterator[Any]:
    """A connected ``distributed.Client``; a scheduler that cannot be reached is one TpusimError."""
    require_dask()
    from distributed import Client, LocalCluster

    address = scheduler_address(scheduler)
    if address:
        client = _connect(Client, address)
        with client:
            yield client
        return
    count = workers or max(1, min(4, os.cpu_count() or 1))
    # loopback only, on ports the system picks: Dask's HTTP server (health routes) starts whatever
    # dashboard_address says, and with None took Dask's own port 8787 (issue 32, row 10)
    with LocalCluster(n_workers=count, threads_per_worker=1, processes=True, host=LOOPBACK,
                      dashboard_address=f"{LOOPBACK}:0", silence_logs=40) as cluster, Client(cluster) as client:
        yield client


LOOPBACK = "127.0.0.1"
ANSWER_S = 30.0    # a scheduler that has not completed Dask's handshake by then is not one (issue 32, row 5)


def _connect(client_class: Any, address: str) -> Any:
    """A Client connected to ``address`` within ``ANSWER_S``, else one TpusimError. Dask's own timeout covers
    the TCP connect only: a peer that accepts and never answers hung the sweep forever, and one that answers
    with other bytes made Dask try to allocate exabytes. The connect runs in a daemon thread, left behind
    when it overruns."""
    outcome: dict[str, Any] = {}

    def connect() -> None:
        try:
            outcome["client"] = client_class(address, timeout="15s")
        except BaseException as error:       # OSError, TimeoutError, MemoryError from a garbled answer, ...
            outcome["error"] = error

    thread = threading.Thread(target=connect, name="tpusim-dask-connect", daemon=True)
    thread.start()
    thread.join(ANSWER_S)
    hint = (f"start one with `dask scheduler`, or leave --scheduler and {SCHEDULER_ENV} unset for a local "
            f"cluster")
    if thread.is_alive():
        raise TpusimError(f"the Dask scheduler at {address!r} accepted the connection but did not answer within "
                          f"{ANSWER_S:.0f} s (is it a Dask scheduler?); {hint}")
    if "error" in outcome:
        error = outcome["error"]
        raise TpusimError(f"cannot reach the Dask scheduler at {address!r} ({type(error).__name__}: "
                          f"{str(error)[:200]}); {hint}")
    return outcome["client"]


def failed_row(point: Point, error: BaseException | str, status: str = "failed") -> dict[str, Any]:
    return {"chip": point.chip, "calibrated": point.calibrated, "topology": point.topology, "slices": point.slices,
            "mode": point.mode,
            "placement": point.placement, "status": status,
            "error": error if isinstance(error, str) else f"{type(error).__name__}: {error}"}


def run_points(client: Any, trace: Trace, points: list[Point], tokens_per_step: int | None = None,
               retries: int = 2, on_row: Callable[[dict[str, Any]], None] | None = None,
               price: Callable[..., dict[str, Any]] = price_point) -> list[dict[str, Any]]:
    """Every point priced on ``client``'s workers by ``price`` (``price_point``; tests pass one that fails);
    rows in the order they finished. Points whose slice cannot exist (a chip without that topology) are
    rows with status "invalid" at once, not tasks."""
    rows: list[dict[str, Any]] = []

    def done(row: dict[str, Any]) -> None:
        rows.append(row)
        if on_row is not None:
            on_row(row)

    tasks = []
    for point in points:
        try:
            point_slice(point)
            tasks.append(point)
        except TpusimError as error:
            done(failed_row(point, str(error), "invalid"))
    if not tasks:
        return rows
    stamp = time.time_ns()
    # the trace as a task, not scattered data: if every worker holding it dies, the scheduler computes it
    # again from the task (scattered data would be lost, and with it every point not yet priced)
    shared = client.submit(_the_trace, trace, pure=False, key=f"tpusim-trace-{stamp}")

    def submit(i: int, point: Point) -> Any:
        return client.submit(_on_worker, price, shared, point, tokens_per_step, retries=retries, pure=False,
                             key=f"tpusim-price-{stamp}-{i}")

    suspects = []
    for point, outcome in _batched(client, submit, tasks):
        if isinstance(outcome, SchedulerLost):
            done(failed_row(point, outcome, "pending"))
        elif isinstance(outcome, BaseException) and type(outcome).__name__ == "KilledWorker":
            suspects.append(point)
        else:
            done(failed_row(point, outcome) if isinstance(outcome, BaseException) else outcome)
    # Dask blames every task queued on a worker that died, not only the one that killed it: each such point
    # runs again alone, so only a point that kills its worker by itself ends as failed
    for i, point in enumerate(suspects):
        future = client.submit(_on_worker, price, shared, point, tokens_per_step, retries=retries, pure=False,
                               key=f"tpusim-alone-{stamp}-{i}")
        for _, outcome in _finished(client, {future: point}):
            done(failed_row(point, outcome) if isinstance(outcome, BaseException) else outcome)
    return rows


IN_FLIGHT = 512     # points submitted at a time: a 10,000-point grid held every future and task at once


class SchedulerLost(RuntimeError):
    """The connection to the scheduler broke: the points not yet priced are rows with status "pending"."""


def _batched(client: Any, submit: Callable[[int, Point], Any], points: list[Point]) -> Iterator[tuple[Point, Any]]:
    """(point, its row or its exception) for every point, with at most IN_FLIGHT submitted at once (memory
    bounded for any grid); when the scheduler is lost, each point not yet priced comes with SchedulerLost."""
    queue = iter(enumerate(points))
    futures: dict[Any, Point] = {}

    def refill() -> None:
        for i, point in queue:
            futures[submit(i, point)] = point
            if len(futures) >= IN_FLIGHT:
                return

    try:
        refill()
        while futures:
            for future, outcome in _finished(client, dict(futures), first_only=True):
                yield futures.pop(future), outcome
            refill()
    except (OSError, TimeoutError, RuntimeError) as error:      # CommClosedError is an OSError
        lost = SchedulerLost(f"the Dask scheduler was lost before this point was priced ({type(error).__name__}: "
                             f"{str(error)[:120]})")
        for point in [*futures.values(), *(point for _, point in queue)]:
            yield point, lost


NO_WORKERS_GRACE_S = 60.0     # a cluster with no worker for this long gets its pending points reported


def _finished(client: Any, futures: dict[Any, Point], poll_s: float = 2.0,
              first_only: bool = False) -> Iterator[tuple[Any, Any]]:
    """(future, its result or its exception) as each finishes (``first_only``: those of the first wait that
    finishes any, so the caller can submit more); when the cluster has had no worker for NO_WORKERS_GRACE_S,
    every point still pending ends with that error instead of waiting forever."""
    from distributed import wait

    pending, lonely_since = set(futures), None
    while pending:
        try:
            finished, pending = wait(pending, timeout=poll_s, return_when="FIRST_COMPLETED")
        except TimeoutError:
            finished = set()
        for future in finished:
            try:
                yield future, future.result()
            except Exception as error:      # noqa: BLE001 (a failed task, KilledWorker, ...: reported as a row)
                yield future, error
            finally:
                future.release()
        if finished and first_only:
            return
        if finished or client.scheduler_info().get("workers"):
            lonely_since = None
        elif lonely_since is None:
            lonely_since = time.monotonic()
        elif time.monotonic() - lonely_since > NO_WORKERS_GRACE_S:
            for future in pending:
                yield future, RuntimeError(f"no Dask worker alive for {NO_WORKERS_GRACE_S:.0f} s: the cluster "
                                           f"lost all its workers (see the workers' logs)")
                future.release()
            return


def _the_trace(trace: Trace) -> Trace:
    return trace


def _on_worker(price: Callable[..., dict[str, Any]], trace: Trace, point: Point,
               tokens_per_step: int | None) -> dict[str, Any]:
    """The task: ``price`` the point and name the worker that did (the table's ``worker`` column)."""
    from distributed import get_worker

    return {**price(trace, point, tokens_per_step), "worker": get_worker().name}


def progress_bar(total: int, quiet: bool) -> Any:
    """tqdm on stderr (a no-op bar with --quiet or when stderr is not a terminal and nobody asked)."""
    from tqdm import tqdm

    return tqdm(total=total, unit="point", desc="pricing", file=sys.stderr, disable=quiet, mininterval=0.5)
