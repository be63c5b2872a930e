"""Fused eager's cut heuristics (tpusim/eager/windows.py, TorchTPU's algorithm): one small program per rule,
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

from tpusim.eager import windows
from tpusim.eager.fusion import FusedKernel, fuse
from tpusim.eager.modes import get_mode
from tpusim.pricing.planning import plan
from tpusim.trace.records import MemoryRecord, OpRecord, TensorMeta, Trace, renumber


def chip(vmem_bytes=64 * 10**6):
    return factories.toy_chip(compile_s=1e-3, vmem_bytes=vmem_bytes)


LINE = iter(range(1, 10**6))


def op(name, ins, out, src=None, n=N, family=""):
    """One op reading storages ``ins`` and writing ``out`` (``n`` float32 elements each)."""
    ins = tuple(i if isinstance(i, TensorMeta) else tensor(i, n) for i in ins)
    out = out if isinstance(out, TensorMeta) else tensor(out, n)
    return OpRecord(0, f"aten::{name}" if "::" not in name else name, "vpu", "float32", ins, (out,),
                    flops=float(n), bytes_read=float(sum(i.nbytes for i in ins)), bytes_written=float(out.nbytes),
                    source=src or f"m.py:{next(LINE)}", family=family)


def clusters(records):
    """[(cut, [op names])] of each eager cluster (one materialization of the deferred graph), in order."""
    found: dict[int, tuple[str, list[str]]] = {}
    for r in fuse(renumber(records), chip()).records:
        if isinstance(r, FusedKernel) and r.window:
            found.setdefault(r.window, (r.cut, []))[1].extend(p.op.removeprefix("aten::") for p in r.parts)
    return list(found.values())


def test_a_second_consumer_of_a_pending_value_makes_it_a_cluster_output_not_a_cut_fanout():
    # y = x+1; a = y*2; b = y*3: y has two consumers. TorchTPU makes the live y an output of its
    # executable (events_queue.cc GetOpUsage: kOutput), so the cluster goes on: one cluster.
    records = [op("add", [1], 2), op("mul", [2], 3), op("mul", [2], 4)]
    fused = fuse(renumber(records), chip())
    assert clusters(records) == [("end", ["add", "mul", "mul"])]
    assert fused.stats.materialized == {"fanout": 1} and fused.stats.windows == 1
    # y, a and b are all held at the end: the split graph (split_utils.cc) runs one executable per output,
    # so y is written once and each mul reads it back: 3 executables of 1 MB read and 1 MB written
    kernels = [r for r in fused.records if isinstance(r, OpRecord)]
    assert fused.stats.executables == 3 and [(k.bytes_read, k.bytes_written) for k in kernels] == [(MB, MB)] * 3
    # one consumer each: nothing materialized
    assert fuse(renumber([op("add", [1], 2), op("mul", [2], 3), op("mul", [3], 4)]), chip()).stats.materialized == {}


def test_a_value_an_earlier_cluster_computed_is_read_not_recomputed_reexecution():
    # h = h * 0.5 three times on one line: no cut (TorchTPU defers the chain); after a sync, reading
    # h (the last cluster's output) counts one reexecution materialization, in the same new cluster
    records = [op("mul", [i], i + 1, src="loop.py:3") for i in (1, 2, 3)]
    assert clusters(records) == [("end", ["mul", "mul", "mul"])]
    sync = factories.HostRecord(0, "sync", reason="item")
    fused = fuse(renumber([*records, sync, op("add", [4], 5), op("mul", [4], 6)]), chip())
    assert fused.stats.cuts == {"sync": 1, "end": 1} and fused.stats.materialized == {"reexecution": 1}


def test_backward_returning_ends_the_cluster_backward():
    # TorchTPU's autograd post-backward materialization: the recorder's zero-second dispatch record
    mark = factories.HostRecord(0, "dispatch", reason=windows.BACKWARD_REASON)
    records = [op("add", [1], 2), op("mul", [2], 3), mark, op("sub", [3], 4)]
    assert clusters(records) == [("backward", ["add", "mul"]), ("end", ["sub"])]
    fused = fuse(renumber(records), chip())
    assert sum(isinstance(r, factories.HostRecord) for r in fused.records) == 1   # kept: the engine prices 0 s


def test_overwriting_a_pending_buffer_other_ops_read_cuts_stale():
    # y = x+1; a = y*2; y.add_(1): the old y (read by a) would be a buffer no tensor refers to any more
    records = [op("add", [1], 2), op("mul", [2], 3), op("add_", [2], 2)]
    assert clusters(records) == [("stale", ["add", "mul"]), ("end", ["add_"])]
    # an in-place chain nobody else reads stays one cluster
    assert clusters([op("add", [1], 2), op("add_", [2], 2), op("mul_", [2], 2)]) == [("end", ["add", "add_", "mul_"])]


def test_an_op_with_a_data_dependent_shape_ends_the_cluster_before_it_dynamic():
    # TorchTPU's nonzero (nonzero.cc) computes its output size in the pending graph and reads it back
    # (.cpu().item()): everything pending runs; nonzero itself opens the next cluster, its size known
    nonzero = dataclasses.replace(op("nonzero", [2], 3), outputs=(tensor(3, shape=(1000, 1), dtype="int64"),))
    records = [op("add", [1], 2), nonzero, op("mul", [2], 4)]
    assert clusters(records) == [("dynamic", ["add"]), ("end", ["nonzero", "mul"])]
    # a sort's shape is static and TorchTPU lowers it: deferred, no cut
    srt = dataclasses.replace(op("sort", [2], 3), op="aten::sort.stable")
    assert fuse(renumber([op("add", [1], 2), srt]), chip()).stats.cuts == {"end": 1}


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


def test_the_repeat_detector_starts_afresh_at_a_step_so_a_step_is_not_cut_mid_way(monkeypatch):
    # a 12-op step ended by optimizer.step() four times, the first step's first op different (a warm-up
    # op): the repeat the detector sees spans step markers and is out of phase with them
    def steps():
        found = [rec for k in range(4) for rec in [*layer(1 + 12 * k, 0), factories.StepMarker(0, k + 1)]]
        found[0] = dataclasses.replace(found[0], op="aten::neg")
        return found
    got = clusters(steps())
    assert [cut for cut, _ in got] == ["step"] * 4 and {len(n) for _, n in got} == {12}
    # TorchTPU's history kept across steps: step 3 and every later step cut after its first op
    monkeypatch.setattr(windows, "HARD_CUTS", frozenset())
    assert [(cut, len(n)) for cut, n in clusters(steps())] == [
        ("step", 12), ("step", 12), ("repeated", 1), ("step", 11), ("repeated", 1), ("step", 11)]


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


@pytest.mark.parametrize("rule", ["stale", "split", "dynamic", "random", "repeated", "backward"])
def test_every_heuristic_is_one_row_of_the_cuts_table(rule):
    assert rule in windows.CUTS


@pytest.mark.parametrize("rule", ["fanout", "reexecution"])
def test_fanout_and_reexecution_materialize_values_without_cutting(rule):
    assert rule in windows.MATERIALIZED and rule not in windows.CUTS


def test_quantize_work_is_an_int8_matmuls_prologue_in_a_compiled_program_only():
    # x (1 MB) -> abs -> amax (reduction) -> div -> round -> clamp -> cast -> _int_mm(xq, w): in a compiled
    # program XLA fuses the quantize into the matmul (one kernel: x and w read, the output written);
    # an eager cluster keeps the matmul without prologue (fusion.RULES), so the quantize is a kernel apart
    def quantized(program):
        scale = tensor(3, 1)                                                # one float per row
        chain = [op("abs", [1], 2), op("amax", [2], scale, family="reduction"), op("div", [1, scale], 4),
                 op("round", [4], 5), op("clamp", [5], 6),
                 op("_to_copy", [6], 7, family="elementwise"),      # a cast: recorded elementwise (costs.py)
                 op("_int_mm", [7, 8], 9, family="quantized_contraction")]
        ops = [dataclasses.replace(r, program=program, unit="mxu" if "mm" in r.op else "vpu",
                                   family=r.family or "elementwise") for r in chain]
        return ops + [MemoryRecord(0, "free", s, MB) for s in range(2, 8)]     # the graph's intermediates die
    in_program = [r for r in fuse(renumber(quantized(1)), chip()).records if isinstance(r, OpRecord)]
    assert len(in_program) == 1 and in_program[0].bytes_read == 2 * MB and in_program[0].bytes_written == MB
    eager = [r for r in fuse(renumber(quantized(0)), chip()).records if isinstance(r, OpRecord)]
    assert [len(k.parts) for k in eager] == [6, 1]
    # x over VMEM: the amax must finish before the divide, so x is read again after it (XLA's two passes);
    # the quantized values stream into the matmul tile by tile and never reach HBM.
    (over,) = [r for r in fuse(renumber(quantized(1)), chip(vmem_bytes=MB // 2)).records if isinstance(r, OpRecord)]
    assert (over.bytes_read, over.bytes_written, over.spilled_bytes) == (3 * MB, MB, MB)
