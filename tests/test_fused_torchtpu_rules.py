"""Fused eager clusters a program as TorchTPU's deferred execution does (issue 29 item 5): one small program per
rule of TorchTPU's source (csrc/eager/ of jonathan1920/torch_tpu), the cut or cost that rule gives worked out by
hand, and the count the old rule gave beside it where the change matters. Traces are built in-process
(tests/factories.py: 1 MB float32 vectors named by storage id).
"""

from __future__ import annotations

import dataclasses

import factories
import pytest
from factories import MB, N, tensor

from tpusim.eager import clusters, windows
from tpusim.eager.fusion import RULES, FusedKernel, fuse, role_of
from tpusim.report.lint import lint
from tpusim.trace.records import (
    CollectiveRecord,
    HostRecord,
    MemoryRecord,
    OpRecord,
    StepMarker,
    TensorMeta,
    Trace,
    TraceMeta,
    renumber,
)

CHIP = factories.toy_chip(compile_s=1e-3, vmem_bytes=64 * 10**6)
LINE = iter(range(1, 10**6))


def op(name, ins, out, family="", src=None, n=N):
    """One op reading storages ``ins`` and writing ``out`` (``n`` float32 elements each), on a line of its own."""
    ins = tuple(i if isinstance(i, TensorMeta) else tensor(i, n) for i in ins)
    out = out if isinstance(out, TensorMeta) else tensor(out, n)
    unit = {"gather_scatter": "sparsecore", "data_movement": "dma"}.get(family, "vpu")
    flops = 0.0 if unit != "vpu" else float(n)
    return OpRecord(0, name if "::" in name else f"aten::{name}", unit, "float32", ins, (out,), flops=flops,
                    bytes_read=float(sum(i.nbytes for i in ins)), bytes_written=float(out.nbytes),
                    source=src or f"m.py:{next(LINE)}", family=family)


def alloc(storage):
    return MemoryRecord(0, "alloc", storage, MB)


def free(storage):
    return MemoryRecord(0, "free", storage, MB)


def kernels(fused):
    return [r for r in fused.records if isinstance(r, FusedKernel)]


def old_rule(monkeypatch):
    """tpusim's rule before: an op whose fusion role is opaque (gathers, scatters, copies, fills, sorts) ended
    its cluster and ran alone."""
    made = clusters.op_node
    monkeypatch.setattr(clusters, "op_node", lambda rec: dataclasses.replace(made(rec),
                                                                              fusible=RULES[role_of(rec)].fusible))


def embedding_steps(steps=2):
    """Two SGD steps of an embedding bag model as the recorder records them (index_select, addmm, sum, fill_,
    mm, embedding_dense_backward, the updates), backward() returning and optimizer.step() after each."""
    found = []
    for _ in range(steps):
        found += [op("index_select", [1, 2], 10, "gather_scatter"), op("addmm", [3, 10, 4], 11, "contraction"),
                  op("sum", [11], 12, "reduction"), op("fill_", [13], 13, "data_movement"),
                  op("mm", [13, 10], 14, "contraction"), op("mm", [13, 4], 15, "contraction"),
                  op("sum", [13], 16, "reduction"),
                  op("embedding_dense_backward", [15, 2], 17, "gather_scatter"),
                  HostRecord(0, "dispatch", reason=windows.BACKWARD_REASON),
                  op("add_", [1, 17], 1), op("add_", [4, 14], 4), op("add_", [3, 16], 3),
                  StepMarker(0, 1)]
    return renumber(found)


def test_ops_torchtpu_lowers_stay_in_their_cluster(monkeypatch):
    """TorchTPU defers every op it implements (op_dispatcher.cc: each DispatchOp is a DeferredOp, gathers, scatters,
    fills and copies included); only host reads, collectives (by default) and the heuristics end a cluster. The
    embedding model's step is then two clusters, ended by backward() returning and by the step: 4 for 2 steps."""
    fused = fuse(embedding_steps(), CHIP)
    assert (fused.stats.windows, fused.stats.cuts) == (4, {"backward": 2, "step": 2})
    old_rule(monkeypatch)
    before = fuse(embedding_steps(), CHIP).stats
    assert (before.windows, before.cuts) == (6, {"opaque": 4, "step": 2})   # was: gathers and fills cut it


def test_dead_deferred_ops_are_dropped_not_run():
    """A deferred op is held by a weak reference in the events queue (events_queue.cc DeferredOpEvent): once no
    tensor and no pending op holds what it made, it is dropped unrun, a chain of them too; a collective
    (side-effecting) always runs."""
    records = renumber([op("add", [1], 2), alloc(3), op("sin", [2], 3), free(3),        # sin's result never read
                        alloc(4), op("exp", [2], 4), alloc(5), op("log", [4], 5), free(4), free(5),  # a dead chain
                        op("mul", [2], 6)])
    fused = fuse(records, CHIP)
    assert [p.op for k in kernels(fused) for p in k.parts] == ["aten::add", "aten::mul"]
    assert (fused.stats.dropped, fused.stats.ops) == (3, 2)
    assert not [r for r in fused.records if isinstance(r, MemoryRecord) and r.storage in (3, 4, 5)]   # never in HBM


def test_a_collective_in_the_graph_runs_even_if_nothing_reads_it(monkeypatch):
    monkeypatch.setenv(windows.COLLECTIVE_ENV, "0")
    reduce = CollectiveRecord(0, "all_reduce", int(MB), inputs=(tensor(2),), outputs=(tensor(3),))
    fused = fuse(renumber([op("add", [1], 2), reduce, free(3)]), CHIP)
    assert fused.stats.dropped == 0 and any(isinstance(r, CollectiveRecord) for r in fused.records)


def test_a_host_to_device_copy_does_not_materialize_pending_work(monkeypatch):
    """TorchTPU copies a CPU tensor into a fresh, materialized buffer (cpu_to_tpu.cc CopyCpuToTpuBuffer:
    TpuMallocAndMemcpyHtoD) without touching the queue: a tensor made from Python values joins the pending
    cluster as an HBM input; tpusim cut there before."""
    records = renumber([op("add", [1], 2), HostRecord(0, "h2d", reason="to_device", bytes=8), op("mul", [2, 7], 3)])
    fused = fuse(records, CHIP)
    assert (fused.stats.windows, fused.stats.cuts) == (1, {"end": 1})
    assert {k.window for k in kernels(fused)} == {1} and records[1] in fused.records


def test_an_empty_tensor_is_a_constant_re_emitted_where_it_is_read():
    """torch.empty is a constant deferred op (op_names.h IsConstantOp) that is never an output: it is re-emitted
    before its first read in each executable (events_queue.cc PrepareTraversals), so zeros' fill_ reads nothing
    from HBM; what the fill makes is an ordinary value (written once, read back by a later cluster)."""
    zero = op("zero_", [5], 5, "data_movement")
    records = renumber([MemoryRecord(0, "alloc", 5, MB), zero, HostRecord(0, "sync", reason="item"),
                        op("add", [5, 1], 6)])
    fill, add = kernels(fuse(records, CHIP))
    assert (zero.bytes_read, fill.bytes_read, fill.bytes_written) == (MB, 0, MB)
    assert add.bytes_read == 2 * MB


def layers(count, held):
    """``count`` layers of 10 chained elementwise ops on lines of their own; each layer's last value is held
    (saved for backward) when ``held``, every other value freed after its reader."""
    names = ["add", "mul", "sub", "div", "exp", "tanh", "sigmoid", "relu", "neg", "abs"]
    found, value = [], 1
    for k in range(count):
        for i, name in enumerate(names):
            found.append(op(name, [value], value + 1, src=f"layer.py:{100 * k + i}"))
            if value > 1 and not (held and (value - 1) % len(names) == 0):
                found.append(free(value))
            value += 1
    return renumber(found)


@pytest.mark.parametrize("mode, executables", [("safe", 4), ("aggressive", 3)])
def test_safe_splits_a_repeat_cluster_at_its_materialization_points_aggressive_does_not(monkeypatch, mode,
                                                                                         executables):
    """A repeat cut materializes with kSplitGraph under safe and kFullGraph under aggressive
    (repeated_ops_heuristic.cc); kSplitGraph runs the cluster as one executable per value it must output
    (split_utils.cc SplitAllMaterializationPoints + ApplySplitPoints). Layers of 10 ops: the repeat is seen at op
    20 (layers 1+2), then every 10 ops; layer 1's held output ends an executable of its own under safe only."""
    monkeypatch.setenv(windows.REPEAT_ENV, mode)
    fused = fuse(layers(4, held=True), CHIP)
    assert fused.stats.cuts == {"repeated": 3} and fused.stats.executables == executables
    monkeypatch.setenv(windows.REPEAT_ENV, "off")            # a sync (here the end) splits in either mode
    assert fuse(layers(2, held=True), CHIP).stats.executables == 2
    assert fuse(layers(2, held=False), CHIP).stats.executables == 1


def test_materialization_chunks_follow_split_utils_example():
    """split_utils.h: x = foo(); y = bar(); z = baz(x); print(y.item()): bar is the required output and foo is
    made one because baz reads x past it; baz runs in no executable of this materialization."""
    assert windows.materialization_chunks([False, True, False], [2, -1, -1]) == [[0], [1]]


def test_a_foreach_ops_per_tensor_records_are_one_node_of_the_split_graph():
    """``_foreach_mul_`` is one DeferredOp with a result per tensor on TorchTPU (op_names.h kForeachMul_List), so the
    split graph ends one executable after it, not after each tensor: an optimizer step over 3 parameters in
    op-major order (every p.mul_, every m.lerp_, every p.addcdiv_, each on one line) is 3 executables, not 9."""
    ps, ms, gs = (10, 11, 12), (20, 21, 22), (30, 31, 32)
    step = [op("mul_", [p], p, src="opt.py:5") for p in ps] + \
        [op("lerp_", [m, g], m, src="opt.py:6") for m, g in zip(ms, gs)] + \
        [op("addcdiv_", [p, m], p, src="opt.py:7") for p, m in zip(ps, ms)]
    fused = fuse(renumber(step), CHIP)
    assert (fused.stats.windows, fused.stats.executables) == (1, 3)


@pytest.mark.parametrize("env, windows_, cuts", [(None, 2, {"collective": 1, "end": 1}), ("0", 1, {"end": 1}),
                                                 ("false", 1, {"end": 1})])
def test_collectives_materialize_unless_torchtpus_variable_says_not(monkeypatch, env, windows_, cuts):
    """process_group_tpu.cc GetCollectiveSplitMode: kSplitBoth by default; kNone when
    TORCH_TPU_INTERNAL_MATERIALIZE_COLLECTIVE_TENSORS is off: the collective is a node of the fused graph, run
    in its place among the cluster's kernels."""
    if env is not None:
        monkeypatch.setenv(windows.COLLECTIVE_ENV, env)
    reduce = CollectiveRecord(0, "all_reduce", int(MB), inputs=(tensor(2),), outputs=(tensor(2),))
    records = renumber([op("mul", [1], 2), reduce, op("add", [2], 3)])
    fused = fuse(records, CHIP)
    assert (fused.stats.windows, fused.stats.cuts) == (windows_, cuts)
    kinds = [type(r).__name__ for r in fused.records if not isinstance(r, MemoryRecord)]
    assert kinds == ["FusedKernel", "CollectiveRecord", "FusedKernel"]


def test_a_random_draw_splits_the_graph_after_it():
    """normal_, uniform_, random_ and multinomial dispatch with OpSplitMode::kSplitAfter (the generator's state
    they update): the cluster ends after the draw."""
    records = renumber([op("add", [1], 2), op("normal_", [3], 3), op("mul", [2, 3], 4)])
    fused = fuse(records, CHIP)
    assert fused.stats.cuts == {"random": 1, "end": 1}
    assert [[p.op for p in k.parts] for k in kernels(fused)][-1] == ["aten::mul"]


# ---- lint ---------------------------------------------------------------------------------------------------------
def fused_trace(records, **meta):
    return Trace(tuple(records), world_size=max(r.rank for r in records) + 1,
                 meta=TraceMeta(eager_mode="fused", **meta))


def rank_program(rank, extra_sync):
    found = [op("add", [1], 2, src="train.py:5"), op("mul", [2], 3, src="train.py:6"),
             op("sub", [3], 4, src="train.py:7"), op("exp", [4], 5, src="train.py:8")]
    if extra_sync:
        found.insert(2, HostRecord(0, "sync", reason="item", source="train.py:6"))
    return [dataclasses.replace(r, rank=rank) for r in found]


def test_ranks_whose_clusters_end_at_different_ops_are_flagged_with_the_first_op_where_they_differ():
    """TorchTPU compiles each cluster per rank; ranks cut differently run different executables and a fused
    collective hangs (a public 32-rank report). Rank 1 reads a value after op 2 (train.py:6), rank 0 does not."""
    same = fused_trace(renumber(rank_program(0, False) + rank_program(1, False)), ranks="all")
    assert not [w for w in lint(same, CHIP) if w.code == "fused-rank-cuts"]
    differ = fused_trace(renumber(rank_program(0, False) + rank_program(1, True)), ranks="all")
    (warning,) = [w for w in lint(differ, CHIP) if w.code == "fused-rank-cuts"]
    assert "rank 0's and rank 1's" in warning.message and "rank 1 ends a cluster (sync)" in warning.message
    assert "aten::mul (op 2)" in warning.message and warning.source == "train.py:6"


def decode(steps, grow=True, backward=False):
    """``steps`` decode steps of 2 layers: the KV cache concatenated with one new position (train.py:10), the
    scores bmm and softmax over it; with ``grow`` False a static cache (the same shapes every step)."""
    found = []
    for s in range(steps):
        length = 8 + s if grow else 32
        for layer in range(2):
            kv = tensor(20 + layer, shape=(1, length, 64))
            cache = tensor(30 + layer, shape=(1, length + 1, 64))
            scores = tensor(40, shape=(1, 1, length + 1))
            found += [OpRecord(0, "aten::cat", "dma", "float32", (kv, tensor(50, shape=(1, 1, 64))), (cache,),
                               source="model.py:10", family="data_movement"),
                      OpRecord(0, "aten::bmm", "mxu", "float32", (tensor(51, shape=(1, 1, 64)), cache), (scores,),
                               flops=2.0 * 64 * (length + 1), source="model.py:11", family="contraction"),
                      OpRecord(0, "aten::_softmax", "vpu", "float32", (scores,), (tensor(41, shape=scores.shape),),
                               flops=5.0 * (length + 1), source="model.py:12", family="reduction")]
        found.append(HostRecord(0, "sync", reason="item", source="generate.py:3"))      # the next token
    if backward:
        found.append(HostRecord(0, "dispatch", reason=windows.BACKWARD_REASON))
    return fused_trace(renumber(found))


def test_a_decode_loop_under_fused_eager_compiles_every_step_anew():
    """Each decode step grows the KV cache by one: every step's clusters have new shapes, so Fused eager compiles
    them all again (TorchTPU's compile cache keys on shapes); the row counts the new signatures per step and
    points to torch.compile with a static cache. A static cache, or a training loop (backward), is not flagged."""
    (warning,) = [w for w in lint(decode(5), CHIP) if w.code == "fused-decode"]
    assert "(5 steps)" in warning.message and "along dim 1" in warning.message
    assert "static cache" in warning.message and warning.source == "model.py:10"
    assert int(warning.message.split("compile anew: ")[1].split(" new cluster")[0]) >= 1   # the same every step
    assert not [w for w in lint(decode(5, grow=False), CHIP) if w.code == "fused-decode"]
    assert not [w for w in lint(decode(5, backward=True), CHIP) if w.code == "fused-decode"]
