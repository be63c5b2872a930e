"""`tpusim compare`: two reports side by side, and one report's program re-priced by replay."""

import json

from factories import training_trace

from tpusim.cli.main import main
from tpusim.eager.modes import get_mode
from tpusim.pricing import price
from tpusim.report import RunInfo, build_report, write_report
from tpusim.slice.topology import build_slice
from tpusim.trace.records import write_trace


def write_run(folder, chip: str, topology: str):
    trace = training_trace()
    slice_ = build_slice(topology, chip)
    timelines = {"strict": price(trace, topology=slice_, mode=get_mode("strict"))}
    out = write_report(folder, build_report(RunInfo("model.py"), trace, slice_, timelines), timelines)
    write_trace(trace, out / "program.jsonl")
    return out


def test_two_reports_side_by_side_with_ratios(tmp_path, capsys):
    a = write_run(tmp_path / "a", "v5p", "3d:1x1x1")
    b = write_run(tmp_path / "b", "v5e", "2d:1x1")
    assert main(["compare", str(a), str(b), "--json"]) == 0
    rows = {(r["mode"], r["metric"]): r for r in json.loads(capsys.readouterr().out)["rows"]}
    step = rows[("strict", "step time (median)")]
    assert step["ratio"] == step["b"] / step["a"]


def test_reprice_equals_a_fresh_run_on_that_chip(tmp_path, capsys):
    a = write_run(tmp_path / "a", "v5p", "3d:1x1x1")
    b = write_run(tmp_path / "b", "v6e", "2d:1x1")
    assert main(["compare", str(a), "--chip", "v6e", "--topology", "2d:1x1", "--json"]) == 0
    repriced = json.loads(capsys.readouterr().out)["rows"]
    fresh = json.loads((b / "report.json").read_text())["modes"]["strict"]
    step = next(r for r in repriced if r["metric"] == "step time (median)")
    assert step["b"] == fresh["step_time_median_s"]


def test_nothing_to_compare_is_a_clear_error(tmp_path, capsys):
    a = write_run(tmp_path / "a", "v5p", "3d:1x1x1")
    assert main(["compare", str(a)]) == 2
    assert "nothing to compare" in capsys.readouterr().err
    assert main(["compare", str(tmp_path / "missing"), str(a)]) == 2


def test_a_script_name_with_terminal_escapes_is_printed_escaped(tmp_path, capsys):
    # Issue 32, row 10: compare echoed a report's script name raw, terminal escape sequences and all.
    a = write_run(tmp_path / "a", "v5p", "3d:1x1x1")
    b = write_run(tmp_path / "b", "v5e", "2d:1x1")
    report = json.loads((b / "report.json").read_text())
    report["run"]["script"] = "evil\x1b[2J\x1b[31m.py"
    (b / "report.json").write_text(json.dumps(report))
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "evil\\x1b[2J\\x1b[31m.py" in out
