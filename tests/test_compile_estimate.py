"""Compile time scales with what is compiled (issue 18 item 5): a miss costs the chip's fixed part plus
its per-op part for every op of the region, so a lone op is cheap and a fused cluster or whole program
pays for its size. Truth: the closed form counted by hand on the toy training trace (mm then gelu per
step, the same shapes every step)."""

import pytest
from factories import toy_chip, training_trace

from tpusim.eager.compile_cache import compile_seconds
from tpusim.eager.fusion import FusedKernel
from tpusim.eager.modes import get_mode
from tpusim.hardware.spec import available_chips, chip_sources, load_chip
from tpusim.pricing import price
from tpusim.slice.topology import build_slice

FIXED, PER_OP = 0.01, 0.001


def _priced(mode: str):
    slice_ = build_slice("3d:1x1x1", chip=toy_chip(compile_s=FIXED, compile_per_op_s=PER_OP))
    return price(training_trace(steps=3), topology=slice_, mode=get_mode(mode))


@pytest.mark.parametrize("mode", ["debug", "strict"])
def test_op_by_op_modes_pay_the_fixed_part_and_one_op_per_distinct_op(mode):
    timeline = _priced(mode)
    stats = timeline.meta["compile_cache"]
    assert stats.misses == 2                               # mm and gelu, once each; steps 2 and 3 hit
    assert stats.compile_s == pytest.approx(2 * (FIXED + PER_OP))
    assert timeline.host_compile_s == pytest.approx(stats.compile_s)


def test_a_fused_cluster_is_one_fixed_part_and_pays_for_each_of_its_ops():
    timeline = _priced("fused")
    stats = timeline.meta["compile_cache"]
    assert stats.misses == 1                               # mm + gelu: one cluster, compiled once
    assert stats.compile_s == pytest.approx(FIXED + 2 * PER_OP)
    assert timeline.host_compile_s == pytest.approx(stats.compile_s)


def test_the_estimate_grows_with_the_region():
    chip = toy_chip(compile_s=FIXED, compile_per_op_s=PER_OP)
    op = training_trace(steps=1).records[1]
    program = FusedKernel.around(op, (op,) * 500, op="program[500 kernels]")
    assert compile_seconds(op, chip) == pytest.approx(FIXED + PER_OP)
    assert compile_seconds(program, chip) == pytest.approx(FIXED + 500 * PER_OP)


@pytest.mark.parametrize("chip", available_chips())
def test_every_chip_file_states_both_parts_as_estimates(chip):
    spec, sources = load_chip(chip), chip_sources(chip)
    assert 0 < spec.compile_per_op_s < spec.compile_s < 0.05       # modest: below the old flat 50 ms
    assert sources["compile_s"].startswith("estimate: ") and sources["compile_per_op_s"].startswith("estimate: ")
