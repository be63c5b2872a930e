"""Fusion: window cuts, grouping rules and the HBM bytes a fused kernel moves, worked out by hand.

Tensors are float32 vectors of 250 000 elements = 1 MB (1e6 bytes) unless said otherwise; storages
are named by small integers; storage 1 is the user's input x (no alloc/free in the trace: it outlives
the trace). Grouping and bytes are worked out inside one executable: every cluster here compiles whole
(``whole_graph``, TorchTPU's kFullGraph); how a cluster splits into executables at its materialization
points (kSplitGraph, TorchTPU's default) is tested in test_fused_torchtpu_rules.py.
"""

import dataclasses

import factories
import pytest
from factories import MB, N, tensor

from tpusim.eager import clusters, fusion, windows
from tpusim.eager.fusion import FusedKernel, fuse
from tpusim.eager.modes import get_mode
from tpusim.pricing import price
from tpusim.slice.topology import build_slice
from tpusim.trace import ops
from tpusim.trace.records import (
    CollectiveRecord,
    HostRecord,
    MemoryRecord,
    OpRecord,
    StepMarker,
    TensorMeta,
    Trace,
    renumber,
)


@pytest.fixture(autouse=True)
def whole_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each cluster compiles as one executable, so the grouping rules are seen whole."""
    monkeypatch.setattr(clusters, "splits_graph", lambda cut: False)


def toy_chip(**overrides):
    """factories.toy_chip with no compile time and 64 MB VMEM."""
    return factories.toy_chip(**{"compile_s": 0.0, "vmem_bytes": 64 * 10**6, **overrides})


t = tensor


def ew(name, ins, out, src="m.py:1", unit="vpu"):
    """An elementwise-style op reading storages ``ins`` and writing ``out`` (1 MB each)."""
    ins = tuple(i if isinstance(i, TensorMeta) else t(i) for i in ins)
    out = out if isinstance(out, TensorMeta) else t(out)
    return OpRecord(0, f"aten::{name}", unit, out.dtype, ins, (out,), flops=float(N),
                    bytes_read=float(sum(i.nbytes for i in ins)), bytes_written=float(out.nbytes), source=src)


def alloc(s, nbytes=MB):
    return MemoryRecord(0, "alloc", s, int(nbytes))


def free(s, nbytes=MB):
    return MemoryRecord(0, "free", s, int(nbytes))


def sync(src="m.py:9"):
    return HostRecord(0, "sync", reason="item", source=src)


def kernels(records):
    return [r for r in records if isinstance(r, OpRecord)]


def chain():
    """a = x * 2; b = a + 1; y = relu(b), eager style: each temporary freed after its last use."""
    return list(renumber([alloc(2), ew("mul", [1], 2, "m.py:1"), alloc(3), ew("add", [2], 3, "m.py:2"), free(2),
                          alloc(4), ew("relu", [3], 4, "m.py:3"), free(3)]))


def test_elementwise_chain_becomes_one_kernel_with_only_entering_and_leaving_bytes():
    fused = fuse(chain(), toy_chip())
    (k,) = kernels(fused.records)
    assert isinstance(k, FusedKernel) and k.op == "fused[mul+add+relu]" and k.unit == "vpu"
    assert k.flops == 3 * N and k.sources == ("m.py:1", "m.py:2", "m.py:3") and k.source == "m.py:1"
    # x enters (1 MB), y leaves (1 MB); a and b stay on chip: their write and read, 2 x 2 MB.
    assert (k.bytes_read, k.bytes_written, k.onchip_bytes) == (MB, MB, 4 * MB)
    assert [t.storage for t in k.inputs] == [1] and [t.storage for t in k.outputs] == [4]
    # a and b never touch HBM: their alloc/free pairs are dropped; y's allocation stays.
    mem = [(m.event, m.storage) for m in fused.records if isinstance(m, MemoryRecord)]
    assert mem == [("alloc", 4)]
    assert fused.stats.ops == 3 and fused.stats.kernels == 1 and fused.stats.cuts == {"end": 1}


def test_fused_moves_fewer_hbm_bytes_than_strict_by_exactly_the_intermediates_on_chip():
    trace = Trace(tuple(chain()))
    slice_ = build_slice("3d:1x1x1", chip=toy_chip())
    strict, fused = (price(trace, topology=slice_, mode=get_mode(m)) for m in ("strict", "fused"))
    # strict: three ops, each reads 1 MB and writes 1 MB = 6 MB; fused: 2 MB.
    assert strict.hbm_bytes_moved == 6 * MB and fused.hbm_bytes_moved == 2 * MB
    kept = fused.meta["fusion"].onchip_bytes
    assert kept == 4 * MB   # intermediates a and b: one write and one read each
    assert strict.hbm_bytes_moved - fused.hbm_bytes_moved == kept
    # The HBM peak drops too: strict holds a+b or b+y (2 MB) at once, fused only y.
    assert strict.peak_hbm_bytes == 2 * MB and fused.peak_hbm_bytes == MB


def test_matmul_takes_elementwise_epilogues_into_one_mxu_kernel():
    x, w = t(1, shape=(256, 512), dtype="bfloat16"), t(5, shape=(512, 1024), dtype="bfloat16")
    bias = t(6, shape=(1024,), dtype="bfloat16")
    h, h2, y = (t(s, shape=(256, 1024), dtype="bfloat16") for s in (2, 3, 4))
    mm = OpRecord(0, "aten::mm", "mxu", "bfloat16", (x, w), (h,), flops=2.0 * 256 * 512 * 1024,
                  bytes_read=x.nbytes + w.nbytes, bytes_written=h.nbytes, matmul=(1, 256, 512, 1024), source="m.py:4")
    records = renumber([mm, ew("add", [h, bias], h2, "m.py:5"), free(2), ew("gelu", [h2], y, "m.py:6"), free(3)])
    (k,) = kernels(fuse(records, toy_chip()).records)
    assert k.op == "fused[mm+add+gelu]" and k.unit == "mxu" and k.dtype == "bfloat16"
    assert k.matmul == (1, 256, 512, 1024)
    assert k.flops == 2.0 * 256 * 512 * 1024 + 2 * N
    # in: x, w, bias; out: y. h and h2 (512 KiB each) stay on chip.
    assert k.bytes_read == x.nbytes + w.nbytes + bias.nbytes and k.bytes_written == y.nbytes
    assert k.onchip_bytes == 2 * (h.nbytes + h2.nbytes)


def test_matmul_takes_no_prologue():
    x, w = t(1, shape=(256, 512)), t(5, shape=(512, 1024))
    p, h, y = t(2, shape=(256, 512)), t(3, shape=(256, 1024)), t(4, shape=(256, 1024))
    mm = OpRecord(0, "aten::mm", "mxu", "float32", (p, w), (h,), flops=1.0, bytes_read=p.nbytes + w.nbytes,
                  bytes_written=h.nbytes, matmul=(1, 256, 512, 1024))
    records = renumber([ew("mul", [x], p), mm, free(2), ew("add", [h], y), free(3)])
    assert [k.op for k in kernels(fuse(records, toy_chip()).records)] == ["aten::mul", "fused[mm+add]"]


def test_a_sync_cuts_the_window_and_what_crosses_it_goes_through_hbm():
    records = renumber([alloc(2), ew("mul", [1], 2), sync(), alloc(3), ew("add", [2], 3), free(2)])
    fused = fuse(records, toy_chip())
    assert [type(r).__name__ for r in fused.records] == ["MemoryRecord", "FusedKernel", "HostRecord",
                                                         "MemoryRecord", "FusedKernel", "MemoryRecord"]
    first, second = kernels(fused.records)
    # Two single-op kernels priced as the ops themselves: a is written, then read back.
    assert first.parts == (records[1],) and (first.bytes_read, first.bytes_written) == (MB, MB)
    assert second.parts == (records[4],) and fused.stats.cuts == {"sync": 1, "end": 1}


def test_collectives_stay_their_own_kernels():
    reduce = CollectiveRecord(0, "all_reduce", int(MB), inputs=(t(2),), outputs=(t(2),), source="m.py:7")
    records = renumber([alloc(2), ew("mul", [1], 2), reduce, alloc(3), ew("add", [2], 3), free(2)])
    fused = fuse(records, toy_chip())
    kinds = [type(r).__name__ for r in fused.records if not isinstance(r, MemoryRecord)]
    assert kinds == ["FusedKernel", "CollectiveRecord", "FusedKernel"]
    assert fused.records[2] is records[2] and fused.stats.cuts == {"collective": 1, "end": 1}


def test_a_value_read_later_stays_in_hbm():
    # a = x*2; b = a+1; c = b*3 (b freed: on chip); sync; d = a*c: a is read after the window (saved
    # for later), so it leaves the kernel; c is never freed (the user holds it) and leaves too.
    records = renumber([alloc(2), ew("mul", [1], 2), alloc(3), ew("add", [2], 3), alloc(4),
                        ew("mul", [3], 4, src="m.py:3"), free(3), sync(), alloc(5), ew("mul", [2, 4], 5)])
    k = kernels(fuse(records, toy_chip()).records)[0]
    assert k.op == "fused[mul+add+mul]"     # two muls on two lines: no reexecution cut
    assert [o.storage for o in k.outputs] == [2, 4]
    # reads: x only (1 MB); writes: a and c (2 MB); on chip: a's read by add, b's write and read.
    assert (k.bytes_read, k.bytes_written, k.onchip_bytes) == (MB, 2 * MB, 3 * MB)


def test_a_value_the_user_still_holds_leaves_even_if_read_only_inside():
    # a = x*2 is never freed in the trace: the user may read it (e.g. .cpu() later), so it is written.
    records = renumber([alloc(2), ew("mul", [1], 2), alloc(3), ew("add", [2], 3)])
    (k,) = kernels(fuse(records, toy_chip()).records)
    assert [o.storage for o in k.outputs] == [2, 3] and k.bytes_written == 2 * MB and k.onchip_bytes == MB


def test_reduction_takes_a_prologue_and_an_epilogue_but_not_a_second_reduction():
    s1, s2, r = t(3, shape=(1,)), t(4, shape=(1,)), t(5, shape=(1,))
    records = renumber([ew("mul", [1, 1], 2), ew("sum", [2], s1), free(2), ew("div", [s1], r),
                        ew("amax", [s1], s2)])
    ops = [k.op for k in kernels(fuse(records, toy_chip()).records)]
    assert ops == ["fused[mul+sum+div]", "aten::amax"]


def test_an_op_reading_two_kernels_merges_them():
    # a = x*2 and b = y*3 are independent; c = a + b joins both into one kernel with two inputs.
    records = renumber([ew("mul", [1], 2), ew("mul", [7], 3), ew("add", [2, 3], 4), free(2), free(3)])
    (k,) = kernels(fuse(records, toy_chip()).records)
    assert k.op == "fused[mul+mul+add]" and [i.storage for i in k.inputs] == [1, 7]
    assert k.wiring == ((("in", 0),), (("in", 1),), (("op", 0, 0), ("op", 1, 0)))


def test_no_kernel_joins_a_producer_it_would_form_a_cycle_with():
    # a = x+1 (kernel A); m = a @ w (kernel M needs A: no prologue); loss = mse_loss(a, m) is a reduction:
    # M already has an anchor, and joining A would make A need M while M needs A. Three kernels.
    a, m, loss = t(2, shape=(500, 500)), t(3, shape=(500, 500)), t(4, shape=(1,))
    mm = OpRecord(0, "aten::mm", "mxu", "float32", (a, t(5, shape=(500, 500))), (m,), flops=1.0,
                  matmul=(1, 500, 500, 500))
    records = renumber([ew("add", [1], a), mm, ew("mse_loss", [a, m], loss)])
    assert [k.op for k in kernels(fuse(records, toy_chip()).records)] == ["aten::add", "aten::mm", "aten::mse_loss"]


def test_in_place_chain_keeps_the_overwritten_version_on_chip():
    # x.add_(1).mul_(2) on the user's x: x is read once and written once; the version between stays on chip.
    records = renumber([ew("add_", [1], 1), ew("mul_", [1], 1)])
    (k,) = kernels(fuse(records, toy_chip()).records)
    assert (k.bytes_read, k.bytes_written, k.onchip_bytes) == (MB, MB, 2 * MB)


def test_window_size_limit_cuts_long_chains(monkeypatch):
    # tpusim's guard on the grouping pass; ops on distinct lines and no repeat detection, so no heuristic cuts
    monkeypatch.setattr(windows, "MAX_CLUSTER_OPS", 64)
    monkeypatch.setenv(windows.REPEAT_ENV, "off")
    size = 64 + 6
    ops = [ew("add", [1], 2)] + [rec for i in range(2, size + 1)
                                 for rec in (ew("add", [i], i + 1, src=f"m.py:{i}"), free(i))]
    fused = fuse(renumber(ops), toy_chip())
    ks = kernels(fused.records)
    assert [len(k.parts) for k in ks] == [64, 6]
    assert ks[0].op == "fused[add+add+add+add+add+...+add](64 ops)"
    assert fused.stats.cuts == {"size": 1, "end": 1}
    # The value crossing the cut (op 64's output, storage 65) leaves the first kernel.
    assert [o.storage for o in ks[0].outputs] == [64 + 1]


def test_intermediates_stream_through_vmem_however_large():
    # XLA tiles a fused kernel: a and b (1 MB each) never need room whole, so a 0.1 MB VMEM spills nothing.
    fused = fuse(chain(), toy_chip(vmem_bytes=100_000))
    (k,) = kernels(fused.records)
    assert (k.spilled_bytes, k.onchip_bytes) == (0, 4 * MB)
    assert (k.bytes_read, k.bytes_written) == (MB, MB)


def reduce_then_scale(vmem_bytes):
    """y = (x * 2) / sum(x): the sum must finish before the divide, so x * 2 is held across that barrier."""
    records = renumber([alloc(2), ew("mul", [1], 2), alloc(3), ew("sum", [1], t(3, 1)), alloc(4),
                        ew("div", [2, t(3, 1)], 4), free(2), free(3)])
    (k,) = kernels(fuse(records, toy_chip(vmem_bytes=vmem_bytes)).records)
    return k


def test_a_value_held_across_a_reduction_fits_vmem_or_goes_through_hbm():
    fits, over = reduce_then_scale(2 * MB), reduce_then_scale(MB // 2)
    assert fits.op == over.op == "fused[mul+sum+div]"
    # Fits: x is read once, y written once; x * 2 and the sum stay on chip.
    assert (fits.bytes_read, fits.bytes_written, fits.spilled_bytes) == (MB, MB, 0)
    # Over: x * 2 (1 MB) is written to HBM and read back after the sum; the 4-byte sum still fits.
    assert (over.bytes_read, over.bytes_written, over.spilled_bytes) == (2 * MB, 2 * MB, 2 * MB)


def test_an_entering_value_read_on_both_sides_of_a_reduction_is_read_twice_when_over_vmem():
    # y = x / sum(x): x enters once when it fits VMEM whole, twice (before and after the sum) when it does not.
    records = renumber([alloc(3), ew("sum", [1], t(3, 1)), alloc(4), ew("div", [1, t(3, 1)], 4), free(3)])
    fits, over = (kernels(fuse(records, toy_chip(vmem_bytes=v)).records)[0] for v in (2 * MB, MB // 2))
    assert (fits.bytes_read, fits.reused_bytes, fits.spilled_bytes) == (MB, MB, 0)
    assert (over.bytes_read, over.reused_bytes, over.spilled_bytes) == (2 * MB, 0, MB)


def test_ops_fusion_cannot_fuse_join_the_cluster_as_kernels_of_their_own():
    # TorchTPU defers every op it lowers (gathers, copies, sorts...): they stay in the cluster, each a kernel
    # of its own there (fusion's opaque role); only a host read runs outside the graph and ends it
    emb = OpRecord(0, "aten::embedding", "sparsecore", "float32", (t(8), t(9)), (t(3),), bytes_read=MB,
                   bytes_written=MB)
    copy = OpRecord(0, "aten::copy_", "dma", "float32", (t(3),), (t(4),), bytes_read=MB, bytes_written=MB)
    unpriced = OpRecord(0, "aten::mystery", "vpu", "float32", (t(4),), (t(5),))   # no cost rule: no FLOPs
    srt = dataclasses.replace(ew("sort", [5], 6), op="aten::sort.stable", family="opaque")
    records = renumber([ew("mul", [1], 2), emb, copy, unpriced, srt, ew("add", [6], 7)])
    fused = fuse(records, toy_chip())
    assert [len(k.parts) for k in kernels(fused.records)] == [1] * 6
    assert {k.window for k in kernels(fused.records)} == {1} and fused.stats.cuts == {"end": 1}
    read = OpRecord(0, "aten::_local_scalar_dense", "vpu", "float32", (t(7),), ())
    fused = fuse(renumber([*records, read, ew("mul", [7], 8)]), toy_chip())
    assert fused.stats.cuts == {"opaque": 1, "end": 1} and type(fused.records[6]) is OpRecord


def test_a_fusion_rule_is_one_table_entry(monkeypatch):
    monkeypatch.setitem(ops.OPS, "add", ops.Op(ops.Family.OPAQUE))   # read when the records are made
    assert [k.op for k in kernels(fuse(chain(), toy_chip()).records)] == ["aten::mul", "aten::add", "aten::relu"]


def test_step_markers_cut_windows():
    records = renumber([ew("mul", [1], 2), StepMarker(0, 0), ew("add", [2], 3)])
    assert fuse(records, toy_chip()).stats.cuts == {"step": 1, "end": 1}




# ---- compiled programs (OpRecord.program > 0): fused in every mode, one launch, one compile -------------------
def program(ops, number=1):
    return [dataclasses.replace(r, program=number) if isinstance(r, OpRecord) else r for r in ops]


def test_strict_fuses_a_compiled_program_and_leaves_eager_ops_alone():
    eager = [alloc(9), ew("neg", [1], 9, "m.py:7")]
    records = renumber(eager + program(chain()) + [ew("abs", [4], 10, "m.py:8")])
    fused = fuse(records, toy_chip(), eager=False)
    ks = kernels(fused.records)
    assert [k.op for k in ks] == ["aten::neg", "fused[mul+add+relu]", "aten::abs"]
    assert [k.program for k in ks] == [0, 1, 0]
    assert (ks[1].bytes_read, ks[1].bytes_written, ks[1].onchip_bytes) == (MB, MB, 4 * MB)
    # One launch for the whole program, at its start.
    launches = [r for r in fused.records if isinstance(r, HostRecord) and r.reason == fusion.PROGRAM_REASON]
    assert len(launches) == 1 and fused.records.index(ks[0]) < fused.records.index(launches[0]) \
        < fused.records.index(ks[1])
    s = fused.stats
    assert (s.programs, s.program_ops, s.program_kernels) == (1, 3, 1)
    assert (s.ops, s.windows, s.cuts) == (0, 0, {})          # eager windows: none in strict


def test_a_program_is_one_window_whatever_its_size_and_opaque_ops_inside_do_not_cut_it():
    size = 300
    ops = [ew("add", [1], 2)] + [rec for i in range(2, size + 1) for rec in (ew("add", [i], i + 1), free(i))]
    srt = dataclasses.replace(ew("sort", [size + 1], 500), op="aten::sort.stable")
    records = renumber(program(ops + [srt, ew("mul", [500], 501), ew("exp", [501], 502), free(500)]))
    ks = kernels(fuse(records, toy_chip(), eager=False).records)
    # the adds: one kernel; the sort alone (an elementwise op may not join an opaque op); mul+exp after it
    assert [len(k.parts) for k in ks] == [size, 1, 2] and ks[1].op == "aten::sort.stable"


def test_two_executions_of_a_program_are_two_windows_and_cut_eager_fused_windows():
    records = renumber([ew("neg", [1], 9)] + program(chain(), 1) + program(chain(), 2))
    fused = fuse(records, toy_chip())
    assert [k.program for k in kernels(fused.records)] == [0, 1, 2]
    assert fused.stats.cuts == {"program": 1} and fused.stats.programs == 2


def test_each_mode_prices_a_program_as_one_launch_and_one_compile():
    chip = toy_chip(compile_s=1.0)
    slice_ = build_slice("3d:1x1x1", chip=chip)
    step = program(chain())
    trace = Trace(renumber([*step, StepMarker(0, 1), *program(step, 2), StepMarker(0, 2)]))
    eager = Trace(renumber([*chain(), StepMarker(0, 1), *chain(), StepMarker(0, 2)]))
    for mode in ("debug", "strict", "fused"):
        compiled = price(trace, topology=slice_, mode=get_mode(mode))
        cache = compiled.meta["compile_cache"]
        assert (cache.regions, cache.misses, cache.hits) == (2, 1, 1)     # one region per execution
        debug = mode == "debug"
        # debug checks each execution once, at its last kernel: one 1-byte flag written per program
        assert compiled.kernels == 2 and compiled.hbm_bytes_moved == 4 * MB + (2 if debug else 0)
        # host: one dispatch per execution (0.5 us each), plus debug's flag read-back per execution
        assert compiled.host_dispatch_s == pytest.approx(2 * 0.5e-6 + (2 * 0.5e-6 if debug else 0))
        if mode != "fused":     # the same ops run eagerly: six launches, three compiles
            run = price(eager, topology=slice_, mode=get_mode(mode))
            assert run.kernels == 6 and run.meta["compile_cache"].misses == 3


def test_a_change_of_eager_mode_cuts_the_window():
    change = HostRecord(0, "dispatch", reason="eager_mode:strict")
    fused = fuse(renumber([ew("mul", [1], 2), change, ew("add", [2], 3)]), toy_chip())
    assert fused.stats.cuts == {"mode": 1, "end": 1} and len(kernels(fused.records)) == 2
