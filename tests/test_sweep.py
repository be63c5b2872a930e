"""tpusim sweep on an embedded Dask LocalCluster: the grid, one row per point whatever happens to its task
(priced, invalid, failed after retries, worker killed), the same numbers as pricing each point alone, the
Pareto front against its definition, and the files written."""

from __future__ import annotations

import contextlib
import itertools
import os
import subprocess
import sys
from pathlib import Path

import cloudpickle
import pandas as pd
import pytest
from factories import training_trace

from tpusim.eager.modes import get_mode
from tpusim.errors import TpusimError
from tpusim.pricing import price
from tpusim.slice.topology import build_slice
from tpusim.sweep import Grid, Point, load_recording, sweep
from tpusim.sweep.cluster import run_points
from tpusim.sweep.grid import load_grid_file, split_list
from tpusim.sweep.pareto import pareto_flags
from tpusim.sweep.point import price_point
from tpusim.trace.records import write_trace

cloudpickle.register_pickle_by_value(sys.modules[__name__])   # the pricers below run on worker processes


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("run")
    write_trace(training_trace(steps=4), folder / "program.jsonl")
    return folder


@pytest.fixture(scope="module")
def client():
    """Two single-threaded workers in this process: the Dask path (scatter, tasks, retries) in a second."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None,
                      silence_logs=50) as cluster, Client(cluster) as dask:
        yield dask


@pytest.fixture(scope="module")
def process_client():
    """Two worker processes (the default cluster's kind), for a worker that dies."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      silence_logs=50) as cluster, Client(cluster) as dask:
        yield dask


def test_pareto_flags_match_the_definition() -> None:
    """On the front iff no other point has chips <= and step <= with one strictly less (ties: first listed)."""
    chips = [16, 16, 64, 64, 256, 8, 512, 256, 64]
    steps = [3.0, 2.0, 1.5, 1.5, 1.6, 5.0, 0.5, 0.9, None]
    flags = pareto_flags(chips, steps)
    for i, (c, s) in enumerate(zip(chips, steps)):
        dominated = s is None or any(
            (c2 <= c and s2 <= s and (c2 < c or s2 < s)) or (c2 == c and s2 == s and j < i)
            for j, (c2, s2) in enumerate(zip(chips, steps)) if j != i and s2 is not None)
        assert flags[i] == (not dominated), (i, c, s)
    assert [i for i, f in enumerate(flags) if f] == [1, 2, 5, 6, 7]


def test_grid_expands_every_axis_and_rejects_bad_values(tmp_path: Path) -> None:
    grid = Grid(("v5p", "v6e"), ("2d:4x4", "3d:4x4x4"), ("strict,fused",), ("1", "2"), ("default",))
    points = grid.points()
    assert len(points) == 2 * 2 * 2 * 2 and len(set(points)) == len(points)
    assert Point("v6e", "3d:4x4x4", 2, "fused") in points
    assert split_list("tp=x,fsdp=yz;default") == ("tp=x,fsdp=yz", "default")
    (tmp_path / "grid.toml").write_text('chip = ["v5p"]\ntopology = ["2d:2x2", "2d:4x4"]\nslices = [1, 4]\n')
    assert load_grid_file(tmp_path / "grid.toml") == {"chips": ("v5p",), "topologies": ("2d:2x2", "2d:4x4"),
                                                      "slices": (1, 4)}
    (tmp_path / "bad.toml").write_text('chips = ["v5p"]\nbatch = [1]\n')
    with pytest.raises(TpusimError, match="unknown key 'batch'"):
        load_grid_file(tmp_path / "bad.toml")
    with pytest.raises(TpusimError, match="mode"):
        Grid(("v5p",), ("2d:4x4",), ("turbo",))
    with pytest.raises(TpusimError, match="slices"):
        Grid(("v5p",), ("2d:4x4",), slices=("0",))


def test_sweep_rows_equal_each_point_priced_alone(recording: Path, client, tmp_path: Path) -> None:
    table = sweep(recording, chips=("v5p", "v6e"), topologies=("2d:2x2", "3d:2x2x2"), modes=("strict", "fused"),
                  slices=(2,), client=client, out=tmp_path / "out")
    assert len(table) == 8
    trace = load_recording(recording).trace
    for row in table.itertuples():
        slice_ = None
        try:
            slice_ = build_slice(row.topology, chip=row.chip, slices=row.slices, calibrated=True)
        except TpusimError as error:
            assert row.status == "invalid" and row.error == str(error)
            continue
        alone = price(trace, topology=slice_, mode=get_mode(row.mode))
        assert row.status == "ok" and row.chips == slice_.total_chips and row.calibrated   # the default
        assert row.total_s == pytest.approx(alone.total_s, rel=1e-12)
    assert set(table[table.status == "invalid"].chip) == {"v6e"}          # v6e is a 2D torus
    assert (table.status == "ok").sum() == 6
    saved = pd.read_parquet(tmp_path / "out" / "sweep.parquet")
    pd.testing.assert_frame_equal(saved, table, check_dtype=False)
    assert len(pd.read_csv(tmp_path / "out" / "sweep.csv")) == 8
    page = (tmp_path / "out" / "sweep.html").read_text()
    assert page.count("data:image/png;base64,") == 2 and "Pareto front" in page and "v6e is a 2D torus" in page


_ATTEMPTS = "TPUSIM_TEST_ATTEMPTS"


def flaky_then_broken(trace, point: Point, tokens=None):
    """Fails the first attempt at every point (retried, then priced); v5e points always fail."""
    marker = Path(os.environ[_ATTEMPTS]) / f"{point.chip}-{point.topology}-{point.mode}"
    if point.chip == "v5e":
        raise RuntimeError("pricer bug on v5e")
    if not marker.exists():
        marker.write_text("tried")
        raise ConnectionError("transient")
    return price_point(trace, point, tokens)


def test_failed_tasks_are_retried_then_reported_never_dropped(recording: Path, client, tmp_path: Path) -> None:
    client.run(lambda: os.environ.__setitem__(_ATTEMPTS, str(tmp_path)))
    points = [Point(c, "2d:2x2", 1, m) for c, m in itertools.product(("v5p", "v5e"), ("strict", "fused"))]
    rows = run_points(client, load_recording(recording).trace, points, retries=1, price=flaky_then_broken)
    by_chip = {(r["chip"], r["mode"]): r for r in rows}
    assert len(rows) == 4 and set(by_chip) == {(p.chip, p.mode) for p in points}
    assert all(by_chip[("v5p", m)]["status"] == "ok" for m in ("strict", "fused"))     # retried once, priced
    assert all(by_chip[("v5e", m)]["status"] == "failed" and by_chip[("v5e", m)]["error"] ==
               "RuntimeError: pricer bug on v5e" for m in ("strict", "fused"))


def kill_worker_on_v5e(trace, point: Point, tokens=None):
    if point.chip == "v5e":
        os._exit(1)                         # the worker process dies mid-task
    return price_point(trace, point, tokens)


@pytest.mark.slow   # worker processes start, and the nanny restarts the killed one until it gives up: ~1 min
def test_a_point_that_kills_its_worker_is_reported(recording: Path, process_client) -> None:
    points = [Point("v5p", "2d:2x2", 1, "strict"), Point("v5e", "2d:2x2", 1, "strict")]
    rows = run_points(process_client, load_recording(recording).trace, points, price=kill_worker_on_v5e)
    status = {r["chip"]: r for r in rows}
    assert status["v5p"]["status"] == "ok", status["v5p"]["error"]
    assert status["v5e"]["status"] == "failed" and "KilledWorker" in status["v5e"]["error"]


@pytest.mark.slow   # a fresh process starting its own local cluster: ~30 s on 2 busy cores
def test_the_command_line_writes_the_table_and_says_what_failed(recording: Path, tmp_path: Path) -> None:
    (tmp_path / "grid.toml").write_text('chip = ["v5p", "v6e"]\ntopology = ["3d:2x2x2"]\nmode = ["strict"]\n')
    done = subprocess.run([sys.executable, "-m", "tpusim", "sweep", str(recording), "--grid",
                           str(tmp_path / "grid.toml"), "--slices", "1,2", "--workers", "1", "--quiet",
                           "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "4 points" in done.stdout and "2 priced, 2 invalid, 0 failed" in done.stdout
    assert "8 chips" in done.stdout and "v5p 3d:2x2x2 strict default" in done.stdout    # the Pareto front
    assert len(pd.read_csv(tmp_path / "out" / "sweep.csv")) == 4
    bad = subprocess.run([sys.executable, "-m", "tpusim", "sweep", str(tmp_path / "nowhere"), "--chip", "v5p"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "no program.jsonl there" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.parametrize("answer", [None, b"HTTP/1.1 200 OK\r\n\r\n" + b"\xff" * 64], ids=["silent", "garbage"])
def test_a_scheduler_that_does_not_answer_is_one_error_in_bounded_time(monkeypatch, answer) -> None:
    # Issue 32, row 5: a peer that accepted and never answered hung `tpusim sweep --scheduler` forever; one that
    # answered with other bytes made Dask try to allocate exabytes (a raw _ArrayMemoryError).
    import socket
    import threading
    import time

    from tpusim.sweep import cluster

    monkeypatch.setattr(cluster, "ANSWER_S", 3.0)
    server = socket.create_server(("127.0.0.1", 0))
    held = []

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = server.accept()
                held.append(conn)
                if answer:
                    conn.sendall(answer)

    threading.Thread(target=serve, daemon=True).start()
    began = time.monotonic()
    with pytest.raises(TpusimError, match="Dask scheduler at 'tcp://127.0.0.1:"):
        with cluster.dask_client(f"tcp://127.0.0.1:{server.getsockname()[1]}"):
            pass
    assert time.monotonic() - began < 20
    server.close()


LISTENING = """
import json, psutil
from tpusim.sweep.cluster import dask_client
with dask_client(None, workers=1):
    me = psutil.Process()
    found = set()
    for process in (me, *me.children(recursive=True)):
        found |= {(c.laddr.ip, c.laddr.port) for c in process.net_connections(kind="tcp")
                  if c.status == psutil.CONN_LISTEN}
print(json.dumps(sorted(found)))
"""


def test_the_local_cluster_listens_on_loopback_only() -> None:
    # Issue 32, row 10: a dashboard was served on Dask's own port 8787 although the code asked for none (a user's
    # own Dask dashboard there made the sweep fail or share it); every socket on loopback, on ports the system picks.
    # In a process of its own: the clusters other tests hold in this one listen where their fixtures say.
    import json

    done = subprocess.run([sys.executable, "-c", LISTENING], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    opened = {tuple(pair) for pair in json.loads(done.stdout.strip().splitlines()[-1])}
    assert len(opened) >= 2                          # the scheduler and its HTTP server at least
    assert {address for address, _ in opened} == {"127.0.0.1"} and 8787 not in {port for _, port in opened}, opened


def test_points_go_in_batches_and_a_lost_scheduler_leaves_pending_rows(recording: Path, client, monkeypatch) -> None:
    # Issue 32, row 5: a 9,900-point grid held every future at once (10.9 GB before a row was written), and a
    # lost scheduler ended in a traceback of cancelled futures with no output.
    from tpusim.sweep import cluster

    monkeypatch.setattr(cluster, "IN_FLIGHT", 2)
    points = [Point(c, "2d:2x2", 1, m) for c in ("v5p", "v5e", "v6e") for m in ("strict", "fused")]
    submitted, finished, most = [], [], [0]
    real_submit = client.submit

    def counting_submit(*args, **kwargs):
        if str(kwargs.get("key", "")).startswith("tpusim-price"):
            submitted.append(kwargs["key"])
            most[0] = max(most[0], len(submitted) - len(finished))
        return real_submit(*args, **kwargs)

    monkeypatch.setattr(client, "submit", counting_submit)
    rows = run_points(client, load_recording(recording).trace, points, on_row=finished.append)
    assert most[0] <= 2 and len(submitted) == len(points) and {r["status"] for r in rows} == {"ok"}

    real_finished, calls = cluster._finished, []

    def losing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise OSError("Stream is closed")           # what the client raises when the scheduler goes
        yield from real_finished(*args, **kwargs)

    monkeypatch.setattr(cluster, "_finished", losing)
    rows = run_points(client, load_recording(recording).trace, points)
    statuses = [r["status"] for r in rows]
    assert len(rows) == len(points) and statuses.count("ok") >= 1 and "pending" in statuses
    assert all("scheduler was lost" in r["error"] for r in rows if r["status"] == "pending")


def test_a_grid_value_that_names_no_slice_is_refused_naming_its_key(tmp_path: Path) -> None:
    # issue 44, W02: `topology = 5` passed the grid file and every point came back "invalid" with the reason
    # only in sweep.csv
    (tmp_path / "grid.toml").write_text("topology = 5\n")
    with pytest.raises(TpusimError, match=r"topology must be a list of names \(text in quotes\), not 5"):
        load_grid_file(tmp_path / "grid.toml")
    (tmp_path / "grid.toml").write_text("slices = [1, 2]\n")            # slices are numbers
    assert load_grid_file(tmp_path / "grid.toml") == {"slices": (1, 2)}


def test_flags_that_are_no_utf8_text_or_name_no_point_are_one_line_with_the_reason(recording: Path, tmp_path: Path,
                                                                                    capsys) -> None:
    # issue 44: non-UTF-8 bytes in --topology/--placement (kept as lone surrogates) reached pyarrow writing
    # sweep.parquet after the sweep (a UnicodeEncodeError traceback, FZ-B); a grid of invalid points said only
    # "every chip x topology pair is invalid" (W17: the placement was the cause)
    from tpusim.cli.main import main

    bad = b"2d:2x2\x85\xa6".decode("utf-8", "surrogateescape")
    for flag in ("--topology", "--placement"):
        assert main(["sweep", str(recording), flag, bad, "--workers", "1", "--quiet",
                     "--out", str(tmp_path / "a")]) == 2
        err = capsys.readouterr().err
        assert f"{flag} b'2d:2x2\\x85\\xa6': not UTF-8 text (byte 0x85 at offset 6)" in err, err
    assert not (tmp_path / "a").exists()
    assert main(["sweep", str(recording), "--chip", "v5p", "--topology", "2d:2x2", "--placement", "tp=q",
                 "--workers", "1", "--quiet", "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert "no point of the grid can exist: --placement needs a DeviceMesh" in err and "Traceback" not in err, err
