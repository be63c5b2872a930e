"""Fused eager's cut heuristics (tpusim/windows.py, TorchTPU's algorithm): one small program per rule,
the clusters it makes in the simulator's fused mode, and what the compile cache makes of them.

The truth is the rule as TorchTPU states it (../shared/research/torchtpu.md, csrc/eager/ of
jonathan1920/torch_tpu), applied by hand to a program a few ops long. Tensors are 1 MB float32
vectors named by storage id (tests/factories.py); each op is on its own source line unless the test
says otherwise. The PJRT target's side of each rule: tests/pjrt/test_pjrt_heuristics.py.
"""

from __future__ import annotations

import dataclasses

import factories
import pytest
from factories import MB, N, tensor

from tpusim import windows
from tpusim.fusion import FusedKernel, fuse
from tpusim.modes import get_mode
from tpusim.planning import plan
from tpusim.trace import MemoryRecord, OpRecord, TensorMeta, Trace, renumber


def chip():
    return factories.toy_chip(compile_s=1e-3, vmem_bytes=64 * 10**6)


LINE = iter(range(1, 10**6))


def op(name, ins, out, src=None, n=N, family=""):
    """One op reading storages ``ins`` and writing ``out`` (``n`` float32 elements each)."""
    ins = tuple(i if isinstance(i, TensorMeta) else tensor(i, n) for i in ins)
    out = out if isinstance(out, TensorMeta) else tensor(out, n)
    return OpRecord(0, f"aten::{name}" if "::" not in name else name, "vpu", "float32", ins, (out,),
                    flops=float(n), bytes_read=float(sum(i.nbytes for i in ins)), bytes_written=float(out.nbytes),
                    source=src or f"m.py:{next(LINE)}", family=family)


def clusters(records):
    """[(cut, [op names])] of each eager cluster, in order."""
    found: dict[int, tuple[str, list[str]]] = {}
    for r in fuse(renumber(records), chip()).records:
        if isinstance(r, FusedKernel) and r.cluster:
            found.setdefault(r.cluster, (r.cut, []))[1].extend(p.op.removeprefix("aten::") for p in r.parts)
    return list(found.values())


def test_a_second_consumer_of_a_pending_value_materializes_it_fanout():
    # y = x+1; a = y*2; b = y*3: b is y's second consumer; y is written once, b reads it from HBM.
    records = [op("add", [1], 2), op("mul", [2], 3), op("mul", [2], 4)]
    assert clusters(records) == [("fanout", ["add", "mul"]), ("end", ["mul"])]
    first = [r for r in fuse(renumber(records), chip()).records if isinstance(r, OpRecord)][0]
    assert {t.storage for t in first.outputs} == {2, 3} and first.bytes_written == 2 * MB
    # one consumer each: no cut, one cluster
    assert clusters([op("add", [1], 2), op("mul", [2], 3), op("mul", [3], 4)]) == [("end", ["add", "mul", "mul"])]


def test_a_loop_carried_chain_is_materialized_each_iteration_reexecution():
    # for _ in range(3): h = h * 0.5   (one line): each iteration's mul reads the last one's result
    records = [op("mul", [i], i + 1, src="loop.py:3") for i in (1, 2, 3)]
    assert clusters(records) == [("reexecution", ["mul"]), ("reexecution", ["mul"]), ("end", ["mul"])]
    # the same chain unrolled on three lines is no loop: one cluster
    assert len(clusters([op("mul", [1], 2), op("mul", [2], 3), op("mul", [3], 4)])) == 1


def test_overwriting_a_pending_buffer_other_ops_read_cuts_stale():
    # y = x+1; a = y*2; y.add_(1): the old y (read by a) would be a buffer no tensor refers to any more
    records = [op("add", [1], 2), op("mul", [2], 3), op("add_", [2], 2)]
    assert clusters(records) == [("stale", ["add", "mul"]), ("end", ["add_"])]
    # an in-place chain nobody else reads stays one cluster
    assert clusters([op("add", [1], 2), op("add_", [2], 2), op("mul_", [2], 2)]) == [("end", ["add", "add_", "mul_"])]


def test_an_op_with_a_data_dependent_shape_runs_alone_dynamic():
    nonzero = dataclasses.replace(op("nonzero", [2], 3), outputs=(tensor(3, shape=(1000, 1), dtype="int64"),))
    records = [op("add", [1], 2), nonzero, op("mul", [2], 4)]
    fused = fuse(renumber(records), chip())
    assert fused.stats.cuts == {"dynamic": 1, "end": 1}
    assert [r.op for r in fused.records if isinstance(r, OpRecord)] == ["aten::add", "aten::nonzero", "aten::mul"]
    # a sort is opaque but static: the same program cuts "opaque"
    srt = dataclasses.replace(op("sort", [2], 3), op="aten::sort.stable")
    assert fuse(renumber([op("add", [1], 2), srt]), chip()).stats.cuts == {"opaque": 1}


def test_an_op_marked_as_a_split_point_is_a_cluster_of_its_own_split():
    ragged = op("tpu::ragged_dot", [2], 3, family="contraction")
    records = [op("add", [1], 2), ragged, op("mul", [3], 4)]
    assert clusters(records) == [("split", ["add"]), ("split", ["tpu::ragged_dot"]), ("end", ["mul"])]


def layer(first: int, lines: int) -> list:
    """12 chained elementwise ops of distinct kinds (one layer), storages first..first+12, on lines lines.."""
    names = ["add", "mul", "sub", "div", "exp", "tanh", "sigmoid", "relu", "neg", "abs", "sqrt", "log"]
    return [op(name, [first + i], first + i + 1, src=f"layer.py:{lines + i}") for i, name in enumerate(names)]


def model(layers: int) -> list:
    """``layers`` repeats of ``layer``, unrolled (each layer's ops on lines of their own: no reexecution)."""
    return [rec for k in range(layers) for rec in layer(1 + 12 * k, 100 * k)]


def test_a_repeated_layer_ends_a_cluster_so_every_layer_is_the_same_compiled_cluster_repeated():
    # TorchTPU's OpWindow: the repeat is seen when layer 2 ends (the last 12 ops equal the 12 before):
    # layers 1+2 are one cluster, then the speculative length-12 check ends every later layer.
    got = clusters(model(5))
    assert [cut for cut, _ in got] == ["repeated", "repeated", "repeated", "repeated"]
    assert [len(names) for _, names in got] == [24, 12, 12, 12]
    for layers in (5, 8):
        fusion = plan(Trace(renumber(model(layers))), get_mode("fused"), chip()).meta["fusion"]
        assert fusion.windows == layers - 1 and fusion.clusters_compiled == 2     # layers 1+2, then one layer


def test_repeat_detection_follows_torchtpus_variable(monkeypatch):
    monkeypatch.setenv(windows.REPEAT_ENV, "aggressive")
    assert [cut for cut, _ in clusters(model(3))] == ["repeated", "repeated"]   # layers 1+2, layer 3
    monkeypatch.setenv(windows.REPEAT_ENV, "off")
    assert [cut for cut, _ in clusters(model(3))] == ["end"]


def test_repeats_shorter_than_the_minimum_are_not_layers():
    # a 5-op pattern three times (15 ops): no suffix of 10 or more repeats; a fourth time would
    # (ten ops = the pattern twice, then again)
    pattern = layer(1, 0)[:windows.REPEAT_MIN // 2]
    def copies(k):
        return [rec for c in range(k) for rec in (dataclasses.replace(
            o, inputs=(tensor(o.inputs[0].storage + 100 * c),), outputs=(tensor(o.outputs[0].storage + 100 * c),))
            for o in pattern)]
    assert [cut for cut, _ in clusters(copies(3))] == ["end"]
    assert [cut for cut, _ in clusters(copies(4))] == ["repeated"]


def test_the_repeat_detector_tries_the_last_length_first_and_skips_ahead():
    detector = windows.RepeatDetector(low=3, high=8)
    hits = [detector.append(k) for k in "abcdabcdabcdab"]
    # abcd seen twice at position 8; then the next search is 4 ops later (position 12)
    assert [i + 1 for i, hit in enumerate(hits) if hit] == [8, 12]


def test_a_foreach_ops_per_tensor_records_are_one_dispatch_for_the_repeat_detector():
    # 30 per-tensor records of one _foreach_mul_ (one line): one history entry, no "repeat" of mul
    foreach = [op("mul_", [10 + i], 10 + i, src="opt.py:5") for i in range(30)]
    assert [cut for cut, _ in clusters(foreach)] == ["end"]


def test_a_cluster_compiles_once_and_hits_when_it_runs_again():
    # the same two-op cluster in two steps: one compile, one hit (a kernel's own region no longer counts)
    step = [op("add", [1], 2, src="m.py:1"), op("mul", [2], 3, src="m.py:2"), MemoryRecord(0, "free", 2, MB)]
    sync = factories.HostRecord(0, "sync", reason="item")
    records = renumber(step + [sync] + step + [sync])
    p = plan(Trace(records), get_mode("fused"), chip())
    cache = p.meta["compile_cache"]
    assert (cache.hits, cache.misses) == (1, 1) and p.meta["fusion"].clusters_compiled == 1


@pytest.mark.parametrize("rule", ["fanout", "reexecution", "stale", "split", "dynamic", "repeated"])
def test_every_heuristic_is_one_row_of_the_cuts_table(rule):
    assert rule in windows.CUTS
