"""One word, one meaning (issue 45): report.json's HFU is named ``hfu`` (versions 1-5 wrote it as ``mfu``, read
back here as HFU), and every surface shows the same two labels for the same two numbers: HFU, every FLOP run over
the peak, and MFU, 6 x params x tokens over the same peak. The truths: the headline's own closed forms (flops over
step time x peak; 6 x 10,000 params x 4096 tokens over step time x peak)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from factories import training_trace

from tpusim.cli.compare import comparison
from tpusim.eager.modes import get_mode
from tpusim.pricing import price
from tpusim.report import RunInfo, build_report, write_report
from tpusim.report.html import headline_cards
from tpusim.report.load import load_report
from tpusim.report.schema import Report
from tpusim.report.summary import summary_table
from tpusim.report.text import HFU_LABEL, MFU_LABEL, MXU_LABEL, percent_text
from tpusim.slice.topology import build_slice

PARAMS, TOKENS = 10_000, 4096


def _report() -> Report:
    trace = training_trace(4)
    trace = dataclasses.replace(trace, meta=trace.meta.replace(trained_parameters=PARAMS))
    slice_ = build_slice("3d:1x1x1", "v5p")
    return build_report(RunInfo("model.py", tokens_per_step=TOKENS), trace, slice_,
                        {"strict": price(trace, topology=slice_, mode=get_mode("strict"))}, [])


def test_hfu_and_mfu_are_named_for_what_they_hold() -> None:
    report = _report()
    mode, peak = report.modes["strict"], build_slice("3d:1x1x1", "v5p").chip.peak_bf16_flops_per_s
    head = mode.headline
    flops = 2 * 64 * 128 * 64 + 8 * 64 * 64                    # one step of training_trace: mm + gelu
    assert mode.hfu == head.hfu == pytest.approx(flops / head.step_s / peak, rel=1e-6)
    assert head.peak_flops_per_s == peak
    assert head.model_flops_utilisation == pytest.approx(6 * PARAMS * TOKENS / head.step_s / peak, rel=1e-6)
    written = report.to_dict()["modes"]["strict"]
    assert "hfu" in written and "mfu" not in written and "mfu" not in written["headline"]


def test_an_older_reports_mfu_is_read_as_hfu(tmp_path: Path) -> None:
    report = _report()
    write_report(tmp_path / "new", report, {})
    data = json.loads((tmp_path / "new" / "report.json").read_text())
    mode = data["modes"]["strict"]
    mode["mfu"] = mode.pop("hfu")                                 # as version 5 wrote it
    mode["headline"]["mfu"] = mode["headline"].pop("hfu")
    mode["headline"]["mfu_peak_flops_per_s"] = mode["headline"].pop("peak_flops_per_s")
    data["version"] = 5
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "report.json").write_text(json.dumps(data))
    old, _ = load_report(tmp_path / "old")
    assert old.modes["strict"].hfu == pytest.approx(report.modes["strict"].hfu)
    assert old.modes["strict"].headline.hfu == pytest.approx(report.modes["strict"].hfu)
    assert old.modes["strict"].headline.model_flops_utilisation == pytest.approx(
        report.modes["strict"].headline.model_flops_utilisation)


def test_every_surface_shows_the_same_label_for_the_same_number(tmp_path: Path) -> None:
    report = _report()
    mode = report.modes["strict"]
    hfu, mfu = percent_text(mode.hfu), percent_text(mode.headline.model_flops_utilisation)
    assert hfu != mfu                                              # two numbers: a mix-up would show
    table = summary_table(report, "out")
    assert f"{HFU_LABEL}" in table and f"{MFU_LABEL}" in table
    assert [line.split()[-1] for line in table.splitlines() if line.startswith((HFU_LABEL, MFU_LABEL))] == [hfu, mfu]
    assert MXU_LABEL in table                                     # says what the MXU share is measured against
    cards = dict(headline_cards(mode, "strict"))
    assert (cards[HFU_LABEL], cards[MFU_LABEL]) == (hfu, mfu)
    rows = {row["metric"]: row["a_text"] for row in comparison(report, report)}
    assert (rows[HFU_LABEL], rows[MFU_LABEL]) == (hfu, mfu)
    assert "MFU" not in rows                                       # compare's old label for HFU
