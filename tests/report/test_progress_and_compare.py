"""The progress bar (phase, records, rate on a terminal; only status lines elsewhere) and `tpusim compare`'s
honest ratios, help text and notes."""

import io
import time

from factories import training_trace

from tpusim.cli.compare import _ratio, notes
from tpusim.cli.main import main
from tpusim.eager.modes import get_mode
from tpusim.pricing import price
from tpusim.report import RunInfo, build_report, write_report
from tpusim.run.progress import Progress
from tpusim.slice.topology import build_slice


def test_on_a_terminal_the_bar_shows_phase_records_and_rate():
    stream = io.StringIO()
    progress = Progress(quiet=False, stream=stream, tty=True)
    records = []
    progress.track("recording mlp.py", lambda: len(records), unit="records")
    for i in range(50):
        records.append(i)
        time.sleep(0.01)
    time.sleep(0.3)
    progress.say("recorded 50 records")
    progress.stop()
    text = stream.getvalue()
    assert "tpusim: recording mlp.py" in text and "50 records" in text and "records/s" in text
    assert "tpusim: recorded 50 records\n" in text


def test_off_a_terminal_there_is_no_bar_only_the_status_lines():
    stream = io.StringIO()
    progress = Progress(quiet=False, stream=stream, tty=False)
    progress.track("recording mlp.py", lambda: 7)
    time.sleep(0.3)
    progress.steps("pricing", 3, unit="modes")
    progress.advance()
    progress.say("priced strict")
    progress.stop()
    assert stream.getvalue() == "tpusim: priced strict\n"
    quiet = io.StringIO()
    Progress(quiet=True, stream=quiet, tty=True).say("nothing")
    assert quiet.getvalue() == ""


def test_ratios_of_values_below_the_resolution_are_not_ratios():
    assert _ratio(0.0, 0.0) is None and _ratio(1.2e-18, 5e-17) is None and _ratio(2.0, 3.0) == 1.5


def test_compare_help_has_no_rest_markup(capsys):
    try:
        main(["compare", "--help"])
    except SystemExit:
        pass
    assert "``" not in capsys.readouterr().out


def test_compare_notes_a_different_chip_and_torus(tmp_path):
    trace = training_trace()
    reports = []
    for chip, topology in (("v5p", "3d:1x1x1"), ("v6e", "2d:1x1")):
        slice_ = build_slice(topology, chip)
        timelines = {"strict": price(trace, topology=slice_, mode=get_mode("strict"))}
        report = build_report(RunInfo("model.py"), trace, slice_, timelines)
        write_report(tmp_path / chip, report, timelines)
        reports.append(report)
    assert any("different slices" in note and "v6e" in note for note in notes(*reports))
    assert not any("different slices" in note for note in notes(reports[0], reports[0]))


def test_script_prints_go_above_the_bar_whole_lines_only():
    from tqdm import tqdm

    from tpusim.run.progress import _AboveBar

    out, bar_stream = io.StringIO(), io.StringIO()
    bar = tqdm(total=None, file=bar_stream, ncols=80, nrows=20)
    above = _AboveBar(out, bar)
    above.write("step 1: loss ")               # print() writes its text, then its newline
    assert out.getvalue() == ""                # never a half line that the bar would overwrite
    above.write("0.5\n")
    above.write("step 2")
    assert out.getvalue() == "step 1: loss 0.5\n"
    above.close_out()
    bar.close()
    assert out.getvalue() == "step 1: loss 0.5\nstep 2"


def test_compare_reads_a_version_2_report_and_says_its_median_meant_something_else(tmp_path, capsys):
    import json

    from tpusim.report.load import load_report
    from tpusim.report.model import SCHEMA_VERSION

    assert SCHEMA_VERSION >= 3                 # step_time_median_s and hfu: the steady state since version 3
    trace = training_trace()
    slice_ = build_slice("3d:1x1x1")
    timelines = {"strict": price(trace, topology=slice_, mode=get_mode("strict"))}
    new = build_report(RunInfo("model.py"), trace, slice_, timelines)
    write_report(tmp_path / "v3", new, timelines)
    old = json.loads((tmp_path / "v3" / "report.json").read_text())
    old["version"] = 2
    (tmp_path / "v2").mkdir()
    (tmp_path / "v2" / "report.json").write_text(json.dumps(old))
    old_loaded, _ = load_report(tmp_path / "v2")
    new_loaded, _ = load_report(tmp_path / "v3")
    mixed = [n for n in notes(old_loaded, new_loaded) if "version 2 report" in n]
    assert mixed and "every step after the first (warm-up compiles included)" in mixed[0]
    assert "the steady-state steps" in mixed[0]
    assert not any("version" in n for n in notes(new_loaded, new_loaded))
    assert not any("version" in n for n in notes(old_loaded, old_loaded))
    assert main(["compare", str(tmp_path / "v2"), str(tmp_path / "v3")]) == 0
    assert f"note: A is a version 2 report and B a version {SCHEMA_VERSION} one" in capsys.readouterr().out
