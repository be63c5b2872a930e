"""Lint rules that must tell the training loop from the code around it, and say only what applies."""

from factories import B, C

from tpusim.eager.compile_cache import CacheStats, Recompile
from tpusim.eager.modes import get_mode
from tpusim.pricing import price
from tpusim.report.lint import lint, mxu_tile_waste, recompilations, syncs_in_step_loop
from tpusim.slice.topology import build_slice
from tpusim.trace.records import HostRecord, OpRecord, StepMarker, TensorMeta, Trace, renumber

STRICT = get_mode("strict")

CHIP = build_slice("3d:1x1x1", "v5p").chip


def sync(source: str, reason: str = "item", rank: int = 0) -> HostRecord:
    return HostRecord(0, "sync", reason=reason, source=source, rank=rank)


def loop_with_syncs_around_it(ranks: int = 1) -> Trace:
    """A DDP-style script: syncs in the constructor (before the loop), .item() every step, then an eval pass
    and torch.save after the loop syncing 108 times."""
    records = []
    for rank in range(ranks):
        records += [sync("train.py:10", "cpu", rank) for _ in range(4)]          # DistributedDataParallel(...)
        for step in range(3):
            records += [sync("train.py:20", "item", rank), StepMarker(0, step, rank=rank)]
        records += [sync("train.py:30", "item", rank)]                           # eval after the loop
        records += [sync("train.py:31", "cpu", rank) for _ in range(108)]        # torch.save
    return Trace(renumber(records))


def test_syncs_before_and_after_the_loop_are_not_in_the_loop():
    findings = syncs_in_step_loop(loop_with_syncs_around_it(), CHIP, None)
    assert [source for _, source in findings] == ["train.py:20"]
    assert "(3x in 3 steps)" in findings[0][0]   # one per step; none of the 4 + 1 + 108 around the loop


def test_ranks_all_counts_one_rank_and_each_rank_its_own_steps():
    findings = syncs_in_step_loop(loop_with_syncs_around_it(ranks=4), CHIP, None)
    assert [source for _, source in findings] == ["train.py:20"] and "(3x in 3 steps)" in findings[0][0]


def test_padding_hint_names_a_head_dim_only_for_attention_shapes():
    def matmul(name: str, shape: tuple[int, int, int, int]) -> OpRecord:
        batch, m, k, n = shape
        return OpRecord(0, name, "mxu", "bfloat16", (), (), flops=2 * batch * m * k * n, matmul=shape, source="m.py:1")

    conv = Trace(renumber([matmul("aten::convolution", (1, 4096, 9, 64))]))
    (message, _), = mxu_tile_waste(conv, CHIP, None)
    assert "k=9 and n=64" in message and "head dim" not in message
    heads = Trace(renumber([matmul("aten::bmm", (32, 128, 64, 128))]))
    (message, _), = mxu_tile_waste(heads, CHIP, None)
    assert "a head dim of 64 wastes half" in message


def test_recompiles_count_only_the_same_op_inside_the_loop():
    a = TensorMeta(1, (64, 128), "bfloat16", 64 * 256, 1)
    records = renumber([OpRecord(0, "aten::mm", "mxu", "bfloat16", (a, B), (C,), source="t.py:1"),
                        StepMarker(0, 0),
                        OpRecord(0, "aten::mm", "mxu", "bfloat16", (a, B), (C,), source="t.py:1"),
                        StepMarker(0, 1),
                        OpRecord(0, "aten::mm", "mxu", "bfloat16", (a, B), (C,), source="t.py:9")])
    in_loop, after_loop = records[2].seq, records[4].seq
    stats = CacheStats(regions=3, hits=0, misses=3, compile_s=0.15, recompiles=(
        Recompile(in_loop, "t.py:1", "aten::mm", ((37, 128), (128, 64)), ((64, 128), (128, 64))),
        Recompile(in_loop, "t.py:2", "aten::copy_", ((144,),), ((256, 16, 48),)),        # two unrelated ops
        Recompile(after_loop, "t.py:9", "aten::mm", ((64, 128),), ((512, 128),))))      # a full-batch eval
    timeline = price(Trace(records), topology=build_slice("3d:1x1x1", "v5p"), mode=get_mode("strict"))
    timeline.meta["compile_cache"] = stats
    assert [source for _, source in recompilations(Trace(records), CHIP, timeline)] == ["t.py:1"]


def test_a_sync_in_one_step_only_is_not_a_loop_habit():
    records = [sync("t.py:5"), StepMarker(0, 0), StepMarker(0, 1), StepMarker(0, 2)]   # e.g. a first-step check
    assert [w for w in lint(Trace(renumber(records)), CHIP) if w.code == "host-sync"] == []


def test_hbm_lint_tells_a_full_chip_from_one_near_capacity():
    from tpusim.report.lint import hbm_near_capacity
    from tpusim.trace.records import MemoryRecord

    def findings(nbytes: int) -> list:
        trace = Trace(renumber([MemoryRecord(0, "alloc", 1, nbytes)]))
        return hbm_near_capacity(trace, CHIP, price(trace, topology=build_slice("3d:1x1x1", "v5p"), mode=STRICT))

    assert findings(int(0.5 * CHIP.hbm_bytes)) == []
    (near, _), = findings(int(0.95 * CHIP.hbm_bytes))
    assert "95% of the v5p's 95 GiB: little headroom for larger batches" in near
    (full, _), = findings(CHIP.hbm_bytes)          # what an out-of-memory run leaves: the chip full
    assert "100% of the v5p's 95 GiB: full: smaller batches, activation checkpointing" in full


def test_a_one_chip_program_on_a_slice_of_many_says_the_other_chips_idle():
    # Issue 31: a one-chip script swept or compared over multi-chip slices got no note that the other chips idle.
    import dataclasses

    from factories import training_trace

    from tpusim.trace.records import CollectiveRecord

    alone = dataclasses.replace(training_trace(), world_size=4)
    (warning,) = [w for w in lint(alone, CHIP) if w.code == "idle-chips"]
    assert "1 of the slice's 4 chips: the other 3 idle" in warning.message
    assert not [w for w in lint(dataclasses.replace(alone, world_size=1), CHIP) if w.code == "idle-chips"]
    reduce = CollectiveRecord(0, "all_reduce", 1024, "bfloat16", source="train.py:7")
    data_parallel = dataclasses.replace(alone, records=renumber([*alone.records, reduce]))
    assert not [w for w in lint(data_parallel, CHIP) if w.code == "idle-chips"]


def test_a_sweep_of_a_one_chip_program_counts_the_chips_it_uses():
    # Issue 31: the Pareto front recommended "4 chips" for a script that uses one.
    from factories import training_trace

    from tpusim.sweep import Point
    from tpusim.sweep.point import price_point
    from tpusim.sweep.write import idle_note, sweep_table

    trace = training_trace()
    rows = [price_point(trace, Point(chip, topology, 1, "strict", "default"))
            for chip, topology in (("v5e", "2d:1x1"), ("v5p", "3d:1x1x1"), ("v5p", "3d:2x2x1"))]
    table = sweep_table(rows)
    assert table["chips_used"].tolist() == [1, 1, 1] and table["chips"].tolist() == [1, 1, 4]
    front = table[table["pareto"]]
    assert front["chips"].tolist() == [1]         # one point: the fastest chip; a 4-chip slice of v5p is no faster
    assert "uses one chip of each slice" in idle_note(table)
