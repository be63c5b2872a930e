"""A sweep of an inference program (issue 30, item 3): each row carries the report's serving numbers (TTFT, TPOT
median, decode tokens/s per chip), and the table marks the throughput-latency Pareto front per chip and slice.

Truths: a sweep row says what `tpusim run`'s report.json says for the same trace and point (the inference
section, built independently by tpusim/report/model.py); the front is checked against the definition, point
by point (no other point on the same chip and slice is at least as fast per token and at least as busy).
"""

from __future__ import annotations

import factories
import pytest
from factories import training_trace

from tpusim.eager.modes import get_mode
from tpusim.pricing import price
from tpusim.report import RunInfo, build_report
from tpusim.slice.topology import build_slice
from tpusim.sweep.grid import Point
from tpusim.sweep.pareto import serving_flags
from tpusim.sweep.point import price_point
from tpusim.sweep.write import serving_front_lines, sweep_html, sweep_table
from tpusim.trace.records import Trace

LAYERS, HEADS, HEAD_DIM, DIM, PROMPT, CONTEXT, STEPS = 2, 8, 128, 4096, 64, 256, 6


def decode_trace(batch: int) -> Trace:
    """A marked prefill, then STEPS decode steps over a static KV cache."""
    return factories.decode_trace(layers=LAYERS, batch=batch, heads=HEADS, head_dim=HEAD_DIM, dim=DIM,
                                  context=CONTEXT, prompt=PROMPT, steps=STEPS)


def test_serving_front_by_definition() -> None:
    tpot = [1.0, 2.0, 2.0, 3.0, None, 1.5]
    rate = [10.0, 30.0, 20.0, 25.0, 99.0, 10.0]
    assert serving_flags(tpot, rate) == [True, True, False, False, False, False]
    assert serving_flags([1.0, 1.0], [5.0, 5.0]) == [True, False]          # a tie: the first stands for both


def test_a_sweep_row_of_a_decode_loop_says_what_the_report_says() -> None:
    trace, point = decode_trace(batch=4), Point("v6e", "2d:1x1", 1, "strict")
    row = price_point(trace, point)
    assert row["status"] == "ok" and row["step_time_s"] is None            # no training steps
    slice_ = build_slice("2d:1x1", chip="v6e")
    report = build_report(RunInfo(script="serve.py", topology="2d:1x1"), trace, slice_,
                          {"strict": price(trace, topology=slice_, mode=get_mode("strict"))})
    assert report.inference is not None and report.inference.phases_from == "marked"
    serving = report.inference.modes["strict"]
    assert row["ttft_s"] == pytest.approx(serving.ttft_s) and row["ttft_s"] > 0
    assert row["tpot_median_s"] == pytest.approx(serving.tpot_median_s) and row["tpot_median_s"] > 0
    assert row["tokens_per_s_per_chip"] == pytest.approx(serving.tokens_per_s_per_chip)
    assert row["tokens_per_s_per_chip"] == pytest.approx(4 * (STEPS - 1) / sum(serving.decode_steps_s[1:]))


def test_the_table_marks_the_throughput_latency_front_per_chip_and_slice() -> None:
    rows = []
    for batch in (1, 4, 16):
        trace = decode_trace(batch)
        for chip, topology in (("v6e", "2d:1x1"), ("v5p", "3d:1x1x1")):
            rows.append({**price_point(trace, Point(chip, topology, 1, "strict")), "batch": batch})
    table = sweep_table(rows, script_columns=("batch",))
    assert table["serving_pareto"].any()
    for _, group in table.groupby(["chip", "topology"]):
        for i, row in group.iterrows():
            beaten = any(o.tpot_median_s <= row.tpot_median_s and o.tokens_per_s_per_chip >= row.tokens_per_s_per_chip
                         and (o.tpot_median_s, o.tokens_per_s_per_chip) != (row.tpot_median_s,
                                                                             row.tokens_per_s_per_chip)
                         for j, o in group.iterrows() if j != i)
            assert row.serving_pareto == (not beaten)
    page = sweep_html(table, "serve")          # no step times to plot against chips: the serving front instead
    assert "Serving Pareto front" in page and "TPOT median against batch" in page
    assert "Step time against chips" not in page and "Pareto front (step time vs chips)" not in page
    lines = serving_front_lines(table)
    assert lines[0].startswith("Serving Pareto front (tokens/s per chip vs TPOT")
    assert len(lines) == 1 + int(table["serving_pareto"].sum())
    assert any("v6e 2d:1x1" in line and "batch=" in line and "tokens/s per chip" in line for line in lines[1:])


def test_a_training_sweep_has_no_serving_front() -> None:
    row = price_point(training_trace(), Point("v5p", "3d:1x1x1", 1, "strict"))
    table = sweep_table([row])
    assert row["tpot_median_s"] is None and not table["serving_pareto"].any()
    assert serving_front_lines(table) == []
