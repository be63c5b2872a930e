"""Recording: the trace a tpu program emits (tpusim.trace.records records)."""

from __future__ import annotations

import torch
from torch import nn

import tpusim.backend as tb
from tpusim.trace.records import HostRecord, MemoryRecord, OpRecord, StepMarker, read_trace, write_trace


def test_trace_of_a_training_step(tmp_path: object) -> None:
    model = nn.Sequential(nn.Linear(64, 128), nn.Tanh(), nn.Linear(128, 10)).to("tpu")
    table = nn.EmbeddingBag(50, 8, mode="sum").to("tpu")
    opt = torch.optim.SGD(list(model.parameters()) + list(table.parameters()), lr=0.1)
    x = torch.randn(32, 64).to("tpu")
    with tb.recording() as rec:
        y = torch.randn(32, 10, device="tpu")
        bags = table(torch.arange(12, device="tpu"), torch.tensor([0, 4, 8], device="tpu"))
        loss = (model(x) - y).square().mean() + bags.sum()
        loss.backward()
        opt.step()
        value = loss.item()
        _ = x[:2].cpu()
        tb.step()
    trace = rec.trace
    assert trace is not None and value == value
    ops = trace.of_kind(OpRecord)
    addmm = [o for o in ops if o.op == "aten::addmm"]
    assert addmm and addmm[0].unit == "mxu"
    assert addmm[0].matmul == (1, 32, 64, 128)
    assert addmm[0].flops >= 2 * 32 * 64 * 128
    assert addmm[0].source.startswith("test_tpu_recording.py:")
    tanh = next(o for o in ops if o.op == "aten::tanh")
    assert tanh.unit == "vpu" and tanh.transcendentals == 32 * 128
    assert any(o.unit == "sparsecore" and "embedding_bag" in o.op for o in ops)
    assert all(o.bytes_read >= 0 and o.bytes_written >= 0 for o in ops)
    hosts = trace.of_kind(HostRecord)
    assert any(h.event == "sync" and h.reason == "item" for h in hosts)
    assert any(h.event == "d2h" and h.reason == "cpu" for h in hosts)
    assert any(h.event == "h2d" for h in hosts)
    steps = trace.of_kind(StepMarker)
    assert [s.step for s in steps] == [1, 2]
    mem = trace.of_kind(MemoryRecord)
    assert any(m.event == "alloc" for m in mem) and any(m.event == "free" for m in mem)
    assert [r.seq for r in trace.records] == list(range(len(trace.records)))
    assert trace.meta.device == "tpu" and trace.meta.chip
    path = tmp_path / "trace.jsonl"
    write_trace(trace, path)
    assert read_trace(path).records == trace.records


def test_views_share_storage_ids() -> None:
    a = torch.randn(8, 8, device="tpu")
    with tb.recording() as rec:
        v = a[2:4]
        v.mul_(2)
    op = rec.trace.of_kind(OpRecord)[0]
    storage = op.outputs[0].storage
    assert storage > 0
    b = torch.empty(0)
    del b
    assert op.inputs[0].storage == storage


def test_print_is_a_host_sync() -> None:
    x = torch.ones(3, device="tpu")
    with tb.recording() as rec:
        print(x)
    reasons = {h.reason for h in rec.trace.of_kind(HostRecord)}
    assert "print" in reasons


def test_not_recording_records_nothing() -> None:
    with tb.recording() as rec:
        pass
    torch.ones(2, device="tpu").sum()
    assert rec.trace is not None and not rec.trace.of_kind(OpRecord)


def test_public_collective_and_meta_api() -> None:
    """What the c10d backend uses: a collective's tensors get the op records' ids; meta lands in the trace."""
    from tpusim.backend.program_trace import recorder
    from tpusim.trace.records import CollectiveRecord

    x = torch.randn(4, 4, device="tpu")
    recorder.record_collective("all_reduce", 64, (0, 1), [x], [x])      # not recording: a no-op
    with tb.recording() as rec:
        y = x * 2
        recorder.record_collective("all_reduce", 64, (0, 1), [y], [y], mesh_axis="dp", reduce_op="sum",
                                   dtype="float32", async_op=True, source="here.py:1")
        recorder.set_meta("placement", "dp=x")
        _ = y + 1
    coll = rec.trace.of_kind(CollectiveRecord)
    assert len(coll) == 1 and coll[0].group == (0, 1) and coll[0].mesh_axis == "dp" and coll[0].async_op
    mul, add = rec.trace.of_kind(OpRecord)
    assert coll[0].inputs[0].id == mul.outputs[0].id == add.inputs[0].id
    assert rec.trace.meta.placement == "dp=x"


def test_an_optimizer_of_cpu_parameters_does_not_end_a_step() -> None:
    # A CPU reference model trained beside the tpu one (examples/gpt3.py --check) marks no tpu step.
    on_tpu, on_cpu = nn.Linear(4, 4).to("tpu"), nn.Linear(4, 4)
    tpu_opt, cpu_opt = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (on_tpu, on_cpu))
    with tb.recording() as rec:
        for model, opt in ((on_tpu, tpu_opt), (on_cpu, cpu_opt), (on_tpu, tpu_opt)):
            model(torch.ones(2, 4, device=next(model.parameters()).device)).sum().backward()
            opt.step()
    assert [s.step for s in rec.trace.of_kind(StepMarker)] == [1, 2]


def test_the_trace_counts_the_parameters_an_optimizer_steps_on_tpu() -> None:
    # model FLOPs (6 x parameters x tokens) need the trained parameter count: 64*128+128 + 128*10+10 here;
    # a CPU optimizer's parameters are not the program's
    model = nn.Sequential(nn.Linear(64, 128), nn.Tanh(), nn.Linear(128, 10)).to("tpu")
    cpu = nn.Linear(4, 4)
    opt, cpu_opt = torch.optim.AdamW(model.parameters()), torch.optim.SGD(cpu.parameters(), lr=0.1)
    with tb.recording() as rec:
        cpu(torch.ones(2, 4)).sum().backward()
        cpu_opt.step()
        model(torch.ones(8, 64, device="tpu")).sum().backward()
        opt.step()
    assert rec.trace.meta.trained_parameters == 64 * 128 + 128 + 128 * 10 + 10
