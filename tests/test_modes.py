"""Eager modes priced on one trace: ordering, compile cache, recompiles, report; numbers by hand.

Toy chip (as in test_engine): HBM 1 TB/s (1 MB = 1 us), launch 1 us, host dispatch 0.5 us (fused:
0.25 us to record an op, 0.25 us to launch a kernel), PCIe 1 GB/s (1 byte = 1 ns), compile 0 unless set.
Times in microseconds in the comments.
"""


import pytest
from factories import US, N, tensor, toy_chip

from tpusim.eager.modes import MODES, get_mode
from tpusim.errors import TpusimError
from tpusim.pricing import price
from tpusim.pricing.planning import RECORD_SHARE
from tpusim.report import RunInfo, build_report, summary_table
from tpusim.slice.topology import build_slice
from tpusim.trace.records import HostRecord, MemoryRecord, OpRecord, StepMarker, Trace, renumber


def toy(**overrides):
    """One chip of factories.toy_chip with no compile time."""
    return build_slice("3d:1x1x1", chip=toy_chip(**{"compile_s": 0.0, **overrides}))


t = tensor


def op(name, ins, out, src, flops=None, transcendentals=0.0, unit="vpu", matmul=None):
    return OpRecord(0, name, unit, out.dtype, tuple(ins), (out,), float(flops if flops is not None else out.nbytes),
                    float(transcendentals), float(sum(i.nbytes for i in ins)), float(out.nbytes), matmul, src)


def chain(ops=3, n=N, base=100, x=1):
    """y = relu(x * 2 + 1)-style chain of ``ops`` elementwise ops at m.py:1.., temporaries freed eagerly."""
    names = ["aten::mul", "aten::add", "aten::relu"]
    records, prev = [], t(x, n)
    for i in range(ops):
        out = t(base + i, n)
        records += [MemoryRecord(0, "alloc", out.storage, out.nbytes),
                    op(names[i % 3], [prev], out, f"m.py:{i + 1}", flops=n)]
        if i:
            records.append(MemoryRecord(0, "free", prev.storage, prev.nbytes))
        prev = out
    return records


def loop(steps=3, sizes=None):
    """A training-loop-like trace: each step runs the chain, syncs on the loss (.item()) and ends."""
    records = []
    for step in range(steps):
        n = sizes[step] if sizes else N
        records += [*chain(n=n, base=100 * (step + 1)), HostRecord(0, "sync", reason="item", source="m.py:9"),
                    StepMarker(0, step)]
    return Trace(renumber(records))


def priced(trace, slice_):
    return {mode: price(trace, topology=slice_, mode=get_mode(mode)) for mode in ("debug", "strict", "fused")}


def test_elementwise_chain_debug_strict_fused_by_hand():
    tl = priced(Trace(renumber(chain())), toy())
    # strict: ops issued at 0.5, 1.0, 1.5; each runs 2 MB (2 us) + launch 1 us: 0.5-3.5, 3.5-6.5, 6.5-9.5.
    assert tl["strict"].total_s == pytest.approx(9.5 * US)
    # fused: the host records 3 ops (3 x 0.25) and launches one kernel (0.25): at 1.0 it runs x in,
    # y out: 2 MB + 1 us launch, ending at 4.0.
    assert tl["fused"].total_s == pytest.approx(4.0 * US)
    assert tl["fused"].host_dispatch_s == pytest.approx((3 * RECORD_SHARE + (1 - RECORD_SHARE)) * 0.5 * US)
    # debug, per op: dispatch 0.5, run 3 (the check adds 1 byte), flag back over PCIe 1 byte = 0.001,
    # host reads the flag 0.5: 4.001 us x 3.
    assert tl["debug"].total_s == pytest.approx(3 * 4.001 * US, rel=1e-6)
    assert tl["debug"].total_s >= tl["strict"].total_s >= tl["fused"].total_s
    assert [tl[m].kernels for m in ("debug", "strict", "fused")] == [3, 3, 1]


def test_launch_bound_trace_gains_most():
    # 20 ops of 1 KB on a fast host (dispatch 0.1 us): every op costs its 1 us launch (+2 ns of HBM).
    slice_ = toy(host_dispatch_ns=100.0)
    tl = priced(Trace(renumber(chain(ops=20, n=250))), slice_)
    # strict: first op issued at 0.1, then the device runs 20 x 1.002 back to back: 20.14.
    assert tl["strict"].total_s == pytest.approx(20.14 * US)
    # fused: record 20 x 0.05 + launch 0.05 = 1.05, one kernel 1.002: 2.052.
    assert tl["fused"].total_s == pytest.approx(2.052 * US)
    # debug: 20 x (0.1 dispatch + 1.002 run + 0.001 flag + 0.1 read-back) = 24.06.
    assert tl["debug"].total_s == pytest.approx(24.06 * US, rel=1e-6)


def mlp(batch, dim, layers=4, steps=3):
    """Forward of an MLP on bf16 (mm + bias add + gelu per layer, sum loss, .item()) for a few steps."""
    records, storage = [], [1000]

    def new(shape):
        storage[0] += 1
        return t(storage[0], shape=shape, dtype="bfloat16")

    for step in range(steps):
        x = t(1, shape=(batch, dim), dtype="bfloat16")
        for layer in range(layers):
            w, b = t(10 + layer, shape=(dim, dim), dtype="bfloat16"), t(20 + layer, shape=(dim,), dtype="bfloat16")
            h, h2, y = new((batch, dim)), new((batch, dim)), new((batch, dim))
            records += [
                MemoryRecord(0, "alloc", h.storage, h.nbytes),
                op("aten::mm", [x, w], h, "mlp.py:10", flops=2.0 * batch * dim * dim, unit="mxu",
                   matmul=(1, batch, dim, dim)),
                MemoryRecord(0, "alloc", h2.storage, h2.nbytes),
                op("aten::add", [h, b], h2, "mlp.py:11", flops=batch * dim),
                MemoryRecord(0, "free", h.storage, h.nbytes),
                MemoryRecord(0, "alloc", y.storage, y.nbytes),
                op("aten::gelu", [h2], y, "mlp.py:12", flops=8 * batch * dim, transcendentals=batch * dim),
                MemoryRecord(0, "free", h2.storage, h2.nbytes)]
            if layer:
                records.append(MemoryRecord(0, "free", x.storage, x.nbytes))
            x = y
        loss = new((1,))
        records += [op("aten::sum", [x], loss, "mlp.py:14", flops=batch * dim),
                    MemoryRecord(0, "free", x.storage, x.nbytes),
                    HostRecord(0, "sync", reason="item", source="mlp.py:15"), StepMarker(0, step)]
    return Trace(renumber(records))


def step_s(timeline):
    return timeline.steps[-1].seconds


def test_mlp_ordering_and_matmul_bound_steps_gain_little():
    v5p = build_slice("3d:1x1x1", "v5p")
    small, big = priced(mlp(256, 1024), v5p), priced(mlp(8192, 8192), v5p)
    for tl in (small, big):
        assert step_s(tl["debug"]) >= step_s(tl["strict"]) >= step_s(tl["fused"])
        assert tl["debug"].total_s >= tl["strict"].total_s >= tl["fused"].total_s
        # 4 x (mm + add + gelu) + sum = 13 ops a step; fused: 4 x fused[mm+add+gelu] + sum.
        assert tl["strict"].kernels == 3 * 13 and tl["fused"].kernels == 3 * 5
    # Small: dispatch-bound (13 x 15 us a step), fusion halves most of it. Big: 8192^3 matmuls bind the
    # step, so fusion saves little; its 128 MB intermediates stream through VMEM a tile at a time (no spill).
    assert step_s(small["fused"]) / step_s(small["strict"]) < 0.75
    assert step_s(big["fused"]) / step_s(big["strict"]) > 0.9
    assert big["fused"].meta["fusion"].spilled_bytes == 0 and small["fused"].meta["fusion"].spilled_bytes == 0


def test_compile_cache_first_step_misses_later_steps_hit():
    slice_ = toy(compile_s=1000 * US)
    tl = priced(loop(), slice_)
    cache = {m: tl[m].meta["compile_cache"] for m in tl}
    # strict/debug: 3 single-op regions compiled in step 0, hit in steps 1 and 2. fused: 1 fused region.
    assert (cache["strict"].misses, cache["strict"].hits) == (3, 6)
    assert (cache["debug"].misses, cache["debug"].hits) == (3, 6)
    assert (cache["fused"].misses, cache["fused"].hits) == (1, 2)
    for mode, timeline in tl.items():
        compiles = [e for e in timeline.events if e.kind == "compile"]
        assert len(compiles) == cache[mode].misses and timeline.host_compile_s == pytest.approx(
            cache[mode].misses * 1000 * US)
        assert all(e.end_s <= timeline.steps[0].end_s for e in compiles) and not cache[mode].recompiles
    # strict step 0: each op compiles (1000) then dispatches (0.5) and runs 3 while the next compiles:
    # ends 3 x 1000.5 + 3 = 3004.5. Steps 1, 2: 9.5 as in the uncompiled chain.
    assert [s.seconds / US for s in tl["strict"].steps] == pytest.approx([3004.5, 9.5, 9.5])
    # fused step 0: record 0.75, compile 1000, launch 0.25, run 3 = 1004.0; then 4.0 a step.
    assert [s.seconds / US for s in tl["fused"].steps] == pytest.approx([1004.0, 4.0, 4.0])


def test_a_shape_change_is_a_recompile_reported_with_its_source_line():
    # Step 2 is a partial batch (half the elements); step 3 is back to full size: a hit, not a recompile.
    tl = priced(loop(steps=4, sizes=[N, N, N // 2, N]), toy(compile_s=1000 * US))
    strict, fused = tl["strict"].meta["compile_cache"], tl["fused"].meta["compile_cache"]
    assert (strict.misses, strict.hits) == (6, 6) and (fused.misses, fused.hits) == (2, 2)
    assert [(r.source, r.op) for r in strict.recompiles] == [("m.py:1", "aten::mul"), ("m.py:2", "aten::add"),
                                                              ("m.py:3", "aten::relu")]
    (r,) = fused.recompiles
    assert (r.source, r.op, r.old_shapes, r.new_shapes) == ("m.py:1", "aten::mul", ((N,),), ((N // 2,),))
    report = build_report(RunInfo("m.py"), loop(steps=4, sizes=[N, N, N // 2, N]), toy(compile_s=1e-3), tl)
    entry = report.modes["fused"]
    assert entry.compile_cache.recompile_count == 1
    assert entry.compile_cache.recompiles[0].source == "m.py:1"
    assert entry.fusion["kernels"] == 4 and entry.fusion["cuts"] == {"sync": 4}
    assert report.modes["strict"].fusion is None
    assert entry.hbm_bytes_moved < report.modes["strict"].hbm_bytes_moved
    assert entry.host_s.compile == pytest.approx(2e-3)
    table = summary_table(report, "reports/x")
    assert "compile hits/misses" in table and "HBM bytes moved" in table
    assert f"recompile: m.py:1: aten::mul [[{N}]] -> [[{N // 2}]] (debug, strict, fused)" in table


def test_unknown_mode_is_refused_with_the_accepted_names():
    with pytest.raises(TpusimError, match="accepted: debug, strict, fused"):
        get_mode("turbo")
    with pytest.raises(TpusimError, match="accepted: debug, strict, fused"):
        price(Trace(()), topology=toy(), mode=get_mode("turbo"))
    assert list(MODES) == ["debug", "strict", "fused"]


def test_an_eval_pass_after_the_loop_is_no_recompile_in_the_summary_report_or_lint():
    # Issue 31: the summary counted the eval pass's new shapes as recompiles while `tpusim check --fail-on
    # recompile` passed. Three full steps, then the same lines once more at half size after the last step.
    records = [*loop(steps=3).records, *chain(n=N // 2, base=900)]
    trace = Trace(renumber(records))
    slice_ = toy(compile_s=1e-3)
    timelines = priced(trace, slice_)
    assert timelines["strict"].meta["compile_cache"].recompiles      # the cache did see the new shapes
    report = build_report(RunInfo("m.py"), trace, slice_, timelines)
    assert {m: report.modes[m].compile_cache.recompile_count for m in report.modes} == {
        "debug": 0, "strict": 0, "fused": 0}
    assert not [w for w in report.warnings if w.code == "recompile"]
    assert "recompile:" not in summary_table(report, "reports/x")


def test_a_program_without_steps_has_no_step_time_in_report_json(tmp_path):
    # Issue 31: report.json wrote the whole program's time as step_time_median_s while the summary said "no steps".
    from tpusim.report import write_report
    from tpusim.report.load import load_report
    from tpusim.testing.budgets import Budgets, evaluate

    trace = Trace(renumber(chain()))
    slice_ = toy()
    timelines = priced(trace, slice_)
    write_report(tmp_path, build_report(RunInfo("m.py"), trace, slice_, timelines), timelines)
    report, _ = load_report(tmp_path)
    for mode, entry in report.modes.items():
        assert entry.step_time_median_s is None and entry.total_s == pytest.approx(timelines[mode].total_s)
        assert entry.time_s == entry.total_s
    check = evaluate(report, Budgets(max_step_time_s=1.0))[0]
    assert check.passed and "whole program (no steps marked)" in check.message
