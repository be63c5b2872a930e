"""c10d collectives issued asynchronously (async_op=True, or on a side stream as FSDP2 does) are recorded as
asynchronous, so the simulator hides them under independent compute and exposes them where an op reads
them; checked against the all-reduce's closed form and the matmul's price."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from tpusim.hardware.compute import kernel_cost
from tpusim.network.collectives import closed_form_time
from tpusim.pricing.engine import simulate
from tpusim.pricing.plan import raw_plan
from tpusim.slice.topology import build_slice
from tpusim.trace.records import CollectiveRecord, OpRecord, read_trace

pytestmark = pytest.mark.slow      # a subprocess that imports torch and runs three 2048^2 matmuls on CPU

SCRIPT = Path(__file__).resolve().parent / "scripts" / "async_collectives.py"
CASES = ("hidden", "exposed", "synchronous", "side_stream")


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    out = tmp_path_factory.mktemp("async")
    result = subprocess.run([sys.executable, str(SCRIPT), str(out)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "OK" in result.stdout, result.stderr[-3000:]
    return {name: read_trace(out / f"{name}.jsonl") for name in CASES}


def priced(trace):
    slice_ = build_slice("3d:4x4x4", "v5p")
    trace = dataclasses.replace(trace, world_size=64)      # recorded as rank 0 of 64 (--ranks one)
    timeline = simulate(raw_plan(trace, slice_.chip), slice_)
    (collective,) = trace.of_kind(CollectiveRecord)
    matmul = next(op for op in trace.of_kind(OpRecord) if op.unit == "mxu")
    return (timeline, closed_form_time(slice_, "all_reduce", collective.bytes),
            kernel_cost(matmul, slice_.chip).seconds)


def test_async_op_and_side_streams_are_recorded_asynchronous(traces):
    flags = {name: trace.of_kind(CollectiveRecord)[0].async_op for name, trace in traces.items()}
    assert flags == {"hidden": True, "exposed": True, "synchronous": False, "side_stream": True}


@pytest.mark.parametrize("name", ["hidden", "side_stream"])
def test_an_async_collective_hides_under_an_independent_matmul(traces, name):
    timeline, all_reduce_s, matmul_s = priced(traces[name])
    assert all_reduce_s < matmul_s                      # the closed form says it fits under the matmul
    assert timeline.collective_exposed_s == 0.0
    assert timeline.busy_s["ici"] == pytest.approx(all_reduce_s, rel=0.02)
    (run,) = timeline.collectives
    matmul = next(e for e in timeline.events if e.kind == "op" and e.cost.unit == "mxu")
    assert run.start_s <= matmul.start_s + 1e-9 and run.end_s < matmul.end_s


def test_an_async_collective_read_at_once_is_exposed_from_the_readers_issue(traces):
    timeline, all_reduce_s, _ = priced(traces["exposed"])
    # the device waits from the moment the host issues the reader (one dispatch after the start) to the end
    dispatch_s = build_slice("3d:4x4x4", "v5p").chip.host_dispatch_ns / 1e9
    assert traces["exposed"].of_kind(OpRecord)[0].op == "aten::mul"
    assert timeline.collective_exposed_s == pytest.approx(all_reduce_s - dispatch_s, rel=0.02)


def test_a_synchronous_collective_is_exposed_whole(traces):
    timeline, all_reduce_s, _ = priced(traces["synchronous"])
    assert timeline.collective_exposed_s == pytest.approx(all_reduce_s, rel=0.02)
