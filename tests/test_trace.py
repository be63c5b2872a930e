"""The trace contract: records and the typed meta round-trip through JSON lines; bad records and unknown
meta keys name the field and what is accepted."""

import json

import pytest

from tpusim.errors import TpusimError
from tpusim.trace.records import (
    CollectiveRecord,
    CompileFacts,
    GraphBreak,
    HostRecord,
    InexactCollective,
    MemoryRecord,
    Mesh,
    OpRecord,
    RanksOne,
    StepMarker,
    TensorMeta,
    Trace,
    TraceMeta,
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
    trace = Trace(records=RECORDS, world_size=4, meta=META)
    path = tmp_path / "trace.jsonl"
    write_trace(trace, path)
    assert read_trace(path) == trace
    lines = path.read_text().splitlines()
    assert json.loads(lines[0])["version"] == 1 and len(lines) == 1 + len(RECORDS)


def test_a_record_is_written_as_dataclasses_asdict_writes_it():
    # record_to_dict no longer calls asdict (it deep-copied every leaf: 45 us a record, so a 400,000-record
    # program.jsonl took 20 s to write when SIGTERM came; issue 44): the same JSON for every kind of record
    import dataclasses

    for record in RECORDS:
        expected = {"kind": record.kind, **dataclasses.asdict(record)}
        assert json.dumps(record_to_dict(record), sort_keys=True) == json.dumps(expected, sort_keys=True)


# A header's meta as the backend writes it (a --ranks one run of a 2x2 DeviceMesh that used torch.compile)
META_JSON = {
    "chip": "v5p", "device": "tpu", "devices": 4, "eager_mode": "strict", "f64_ops": [], "hbm_bytes": 102005473280,
    "numerics": True, "ranks": "one", "placement": "tp=x,fsdp=y",
    "meshes": [{"dim_names": ["fsdp", "tp"], "shape": [2, 2], "ranks": [0, 1, 2, 3]}],
    "ranks_one": {"rule": "every peer holds this rank's tensor", "not_reference_correct": [
        {"count": 2, "kind": "all_gather", "source": "model.py:9", "why": "exact only if every shard is equal"}]},
    "torch_compile": {"graphs": 2, "graph_breaks": [{"reason": "print", "source": "model.py:4"}],
                      "recompiles": [], "eager_graphs": []},
}
META = TraceMeta(chip="v5p", device="tpu", devices=4, eager_mode="strict", f64_ops=(), hbm_bytes=102005473280,
                 numerics=True, ranks="one", placement="tp=x,fsdp=y",
                 meshes=(Mesh(("fsdp", "tp"), (2, 2), (0, 1, 2, 3)),),
                 ranks_one=RanksOne("every peer holds this rank's tensor", (
                     InexactCollective("all_gather", "model.py:9", 2, "exact only if every shard is equal"),)),
                 torch_compile=CompileFacts(2, (GraphBreak("print", "model.py:4"),)))


def test_meta_is_typed_and_written_as_the_same_json(tmp_path):
    assert TraceMeta.from_dict(META_JSON) == META
    assert META.to_dict() == META_JSON                     # the on-disk form is unchanged by the typing
    path = tmp_path / "trace.jsonl"
    write_trace(Trace(records=RECORDS, meta=META), path)
    assert json.loads(path.read_text().splitlines()[0])["meta"] == META_JSON
    assert TraceMeta().to_dict() == {}                     # nothing set, nothing written


def test_an_old_header_loads_and_a_dict_meta_is_read_as_its_json_form(tmp_path):
    path = tmp_path / "old.jsonl"
    header = {"schema": "tpusim-trace", "version": 1, "world_size": 4, "rank": 0, "meta": META_JSON}
    path.write_text(json.dumps(header) + "\n" + json.dumps(record_to_dict(RECORDS[3])) + "\n")
    assert read_trace(path).meta == META
    assert Trace(records=RECORDS, meta=META_JSON).meta == META
    assert read_trace(path).meta.meshes[0].size == 4


@pytest.mark.parametrize("meta, message", [
    ({"script": "model.py"}, r"unknown key\(s\) \['script'\]; accepted: device, chip"),
    ({"meshes": [{"dim_names": ["tp"], "shape": [4]}]}, r"meshes\[0\]: missing key\(s\) \['ranks'\]"),
    ({"devices": "4"}, "devices must be a whole number"),
    ({"ranks": "some"}, "ranks 'some' is not one of one, all"),
    ({"torch_compile": {"graphs": 1, "breaks": []}}, r"torch_compile: unknown key\(s\) \['breaks'\]"),
])
def test_bad_meta_names_the_key_and_what_is_accepted(tmp_path, meta, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"schema": "tpusim-trace", "version": 1, "meta": meta}) + "\n")
    with pytest.raises(TpusimError, match=message):
        read_trace(path)


def test_meta_replace_refuses_unknown_names():
    assert META.replace(placement=None).placement is None
    with pytest.raises(TpusimError, match=r"unknown key\(s\) \['note'\]"):
        META.replace(note={"a": 1})


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
