"""The trace contract: records round-trip through JSON lines; bad records name the field."""

import json

import pytest

from tpusim.errors import TpusimError
from tpusim.trace import (
    CollectiveRecord,
    HostRecord,
    MemoryRecord,
    OpRecord,
    StepMarker,
    TensorMeta,
    Trace,
    read_trace,
    record_from_dict,
    record_to_dict,
    write_trace,
)

A = TensorMeta(id=1, shape=(64, 128), dtype="bfloat16", nbytes=64 * 128 * 2, storage=1)
B = TensorMeta(id=2, shape=(128, 128), dtype="bfloat16", nbytes=128 * 128 * 2, storage=2)
C = TensorMeta(id=3, shape=(64, 128), dtype="bfloat16", nbytes=64 * 128 * 2, storage=3)

RECORDS = (
    MemoryRecord(seq=0, event="alloc", storage=3, bytes=C.nbytes),
    OpRecord(seq=1, op="aten::mm", unit="mxu", dtype="bfloat16", inputs=(A, B), outputs=(C,),
             flops=2 * 64 * 128 * 128, bytes_read=A.nbytes + B.nbytes, bytes_written=C.nbytes,
             matmul=(1, 64, 128, 128), source="model.py:12"),
    CollectiveRecord(seq=2, collective="all_reduce", bytes=C.nbytes, group=(0, 1, 2, 3), reduce_op="sum",
                     inputs=(C,), outputs=(C,), async_op=True),
    HostRecord(seq=3, event="sync", reason="item", source="model.py:20"),
    StepMarker(seq=4, step=0),
)


def test_trace_round_trips_through_json_lines(tmp_path):
    trace = Trace(records=RECORDS, world_size=4, meta={"script": "model.py"})
    path = tmp_path / "trace.jsonl"
    write_trace(trace, path)
    assert read_trace(path) == trace
    lines = path.read_text().splitlines()
    assert json.loads(lines[0])["version"] == 1 and len(lines) == 1 + len(RECORDS)


def test_of_kind_filters_records():
    assert Trace(records=RECORDS).of_kind(OpRecord) == [RECORDS[1]]


def test_missing_field_is_named():
    data = record_to_dict(RECORDS[1])
    del data["unit"]
    with pytest.raises(TpusimError, match=r"missing field\(s\) \['unit'\]"):
        record_from_dict(data)


@pytest.mark.parametrize("change, message", [
    ({"kind": "kernel"}, "unknown kind 'kernel'; accepted: op, collective"),
    ({"unit": "gpu"}, "unit 'gpu' is not one of mxu, vpu, sparsecore, dma"),
    ({"colour": 1}, r"unknown field\(s\) \['colour'\]"),
])
def test_bad_record_names_field_and_accepted_values(change, message):
    with pytest.raises(TpusimError, match=message):
        record_from_dict({**record_to_dict(RECORDS[1]), **change})


def test_unknown_schema_version_is_refused(tmp_path):
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps({"schema": "tpusim-trace", "version": 99}) + "\n")
    with pytest.raises(TpusimError, match="version 99 is not supported"):
        read_trace(path)
