"""Bad input gives one clear line and exit code 2, before any work is done (issue 17, rows 5, 6, 8, 9):
flags that parsers refuse, --out and --placement checked before the script runs, report.json and
program.jsonl that are not what `tpusim compare` and `read_trace` expect. Torch-free: every error here
comes before the device is loaded."""

import json
from pathlib import Path

import pytest
from factories import training_trace

from tpusim.cli.main import main
from tpusim.eager.modes import get_mode
from tpusim.errors import TpusimError
from tpusim.output import write_atomic
from tpusim.pricing import price
from tpusim.report import RunInfo, build_report, load_report, report_json
from tpusim.report.model import SCHEMA_VERSION
from tpusim.slice.topology import build_slice
from tpusim.trace.records import read_trace, write_trace
from tpusim.units import parse_bytes

ROOT = Path(__file__).resolve().parents[1]
MLP = str(ROOT / "examples" / "mlp.py")


def one_error_line(capsys, *argv: str) -> str:
    """Run the CLI in this process; it must exit 2 with exactly one line on stderr, nothing on stdout."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"tpusim {argv[0]}: error: ")
    return err


# ---- row 6: parsers ------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, expected", [
    (["collective", "all_reduce", "--bytes", "1e400", "--topology", "3d:4x4x4"],
     "size '1e400' is out of range: at most 9223372036854775807 bytes (8 EiB)"),
    (["topology", "3d:" + "9" * 5000 + "x1x1"], "is too long (5007 characters, at most 64)"),
    (["topology", "3d:" + "9" * 40 + "x1x1"], "an axis length has more than 6 digits"),
    (["topology", "2d:16x16", "--slices", "1000000000"],
     "--slices 1000000000 is out of range; accepted: a whole number from 1 to 1024"),
    (["collective", "all_reduce", "--bytes", "1GiB", "--topology", "2d:16x16", "--slices", "1000000000"],
     "accepted: a whole number from 1 to 1024"),
    (["topology", "2d:4x4", "--slices", "\u0663"], "--slices '\u0663' contains a non-ASCII character"),
    (["topology", "3d:\u0668x\u0668x\u0668"], "bad topology '3d:\u0668x\u0668x\u0668' contains a non-ASCII character "
                                              "('\u0668', U+0668)"),
    (["topology", "3d:4x4\tx4"], r"bad topology '3d:4x4\tx4' contains a control character ('\t', U+0009)"),
    (["topology", "3d:4x4x4\n"], r"bad topology '3d:4x4x4\n' contains a control character"),
    (["topology", "2d:4x4", "--chip", "v5e\n"], r"--chip 'v5e\n' contains a control character"),
    (["topology", "2d:4x4", "--chip", "a" * 300 + ".toml"], "is not a chip name or a file path"),
    (["topology", "2d:4x4", "--wrap", "x\ny"], r"--wrap 'x\ny' contains a control character"),
    (["collective", "all_reduce", "--bytes", "1\tGiB", "--topology", "3d:4x4x4"], r"size '1\tGiB' contains"),
    (["collective", "all_reduce", "--bytes", "1GiB", "--topology", "3d:4x4x4", "--axes", "x" * 500], "too long"),
])
def test_parsers_refuse_with_one_line_and_never_echo_raw(capsys, argv, expected):
    err = one_error_line(capsys, *argv)
    assert expected in err
    assert "\t" not in err and err.count("\n") == 1


def test_bytes_are_exact():
    assert parse_bytes("9007199254740993") == 9007199254740993     # 2**53 + 1: a float would give ...992
    assert parse_bytes("9007199254740993B") == 9007199254740993
    assert parse_bytes("1.5KiB") == 1536 and parse_bytes("2e3") == 2000


# ---- row 8: --out and --placement before the script runs ------------------------------------------------

@pytest.fixture
def no_device(monkeypatch):
    """Fail the test if `tpusim run` gets as far as loading the device (the script would run next)."""
    from tpusim.run import pipeline as run

    def loaded():
        raise AssertionError("the device was loaded: the bad flag was not caught before the script ran")
    monkeypatch.setattr(run, "_import_backend", loaded)


def test_a_negative_retry_count_is_refused_by_the_parser(capsys):
    """Issue 32 row 10: ``sweep --retries -5`` was accepted."""
    with pytest.raises(SystemExit) as stop:
        main(["sweep", MLP, "--retries", "-5"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "argument --retries: '-5' is not a whole number >= 0" in err
    assert "Traceback" not in err


@pytest.fixture
def a_file(tmp_path):
    path = tmp_path / "some_file"
    path.write_text("not a folder")
    return path


@pytest.mark.parametrize("out, expected", [
    ("/proc/x", "--out '/proc/x': cannot create the folder: No such file or directory"),
    ("{file}/sub", "cannot create the folder: Not a directory"),
    ("{file}", "exists and is not a folder"),
    ("", "--out '' names no folder"),             # issue 32 row 10: it wrote the report into the current folder
    ("  ", "--out '' names no folder"),
    ("/tmp/" + "a" * 300, "cannot create the folder: File name too long"),   # issue 32 row 9: a raw OSError
])
def test_bad_out_fails_before_the_script_runs(capsys, no_device, a_file, out, expected):
    err = one_error_line(capsys, "run", MLP, "--out", out.format(file=a_file))
    assert expected in err


@pytest.mark.parametrize("placement, expected", [
    ("tp=q", "'tp=q' is not DIM=AXES"),
    ("tp=z", "2d:2x2 has no axis z; accepted: xy"),
    ("tp=x9", "asks for 9 chips of axis x, which has 2"),
    ("tp=x\t", r"contains a control character ('\t'"),
    ("", "names no dim"),
])
def test_bad_placement_fails_before_the_script_runs(capsys, no_device, tmp_path, placement, expected):
    err = one_error_line(capsys, "run", MLP, "--topology", "2d:2x2", "--placement", placement,
                         "--out", str(tmp_path / "out"))
    assert expected in err
    assert not (tmp_path / "out").exists()


# ---- row 9: the script and --png ------------------------------------------------------------------------

def test_a_folder_given_as_the_script_is_called_a_folder(capsys, tmp_path):
    err = one_error_line(capsys, "run", str(tmp_path))
    assert "is a folder, not a Python file" in err


def test_png_into_a_missing_folder_is_one_line(capsys):
    err = one_error_line(capsys, "topology", "2d:4x4", "--png", "/missing/dir/x.png")
    assert "the folder '/missing/dir' does not exist" in err


def test_png_with_an_unknown_format_is_one_line(capsys, tmp_path):
    err = one_error_line(capsys, "topology", "2d:2x2", "--png", str(tmp_path / "x.nope"))
    assert "Format 'nope' is not supported" in err
    assert list(tmp_path.iterdir()) == []     # no temporary file left behind


# ---- row 5: reading report.json and program.jsonl --------------------------------------------------------

def write_run(folder: Path, script: str = "model.py") -> Path:
    """report.json and program.jsonl as `tpusim run` writes them (no figures: compare reads neither)."""
    trace, slice_ = training_trace(), build_slice("3d:1x1x1")
    timelines = {"strict": price(trace, topology=slice_, mode=get_mode("strict"))}
    folder.mkdir(parents=True)
    write_atomic(folder / "report.json", report_json(build_report(RunInfo(script), trace, slice_, timelines)))
    write_trace(trace, folder / "program.jsonl")
    return folder


@pytest.mark.parametrize("content, expected", [
    (bytes(range(256)), "not a tpusim report (not UTF-8 text)"),
    (b"{}", "not a tpusim report (a JSON object without schema 'tpusim-report')"),
    (b"[]", "not a tpusim report (a JSON list)"),
    (b'{"schema": "tpusim-report", "ver', "not valid JSON"),
    (b'{"schema": "tpusim-report", "version": 99}',
     f"report schema version 99 is not one this tpusim reads (it reads versions 1, 2, 3, 4, 5, {SCHEMA_VERSION}) "
     "(written by a newer"),
    (b'{"schema": "tpusim-report", "version": 0}', "(written by an older tpusim: run the script again"),
    (b'{"schema": "tpusim-report", "version": 2, "complete": true}', "run is missing"),
])
def test_compare_refuses_what_is_not_a_report(capsys, tmp_path, content, expected):
    good = write_run(tmp_path / "good")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "report.json").write_bytes(content)
    for argv in (["compare", str(good), str(bad)], ["compare", str(bad), str(good)],
                 ["compare", str(bad), "--mode", "fused"]):
        assert expected in one_error_line(capsys, *argv)


def test_a_field_of_the_wrong_kind_is_named(tmp_path):
    folder = write_run(tmp_path / "a")
    report = json.loads((folder / "report.json").read_text())
    report["modes"]["strict"]["host_s"]["stall"] = "slow"
    (folder / "report.json").write_text(json.dumps(report))
    with pytest.raises(TpusimError, match="modes.strict.host_s.stall must be a finite number, not 'slow'"):
        load_report(folder)


def test_a_version_1_report_is_still_read(tmp_path):
    folder = write_run(tmp_path / "a")
    report = json.loads((folder / "report.json").read_text())
    for key in ("exit_code", "interrupted"):
        del report[key]
    report["version"] = 1
    (folder / "report.json").write_text(json.dumps(report))
    assert load_report(folder)[0].version == 1


def test_compare_of_different_scripts_says_so(capsys, tmp_path):
    a, b = write_run(tmp_path / "a", "model_a.py"), write_run(tmp_path / "b", "model_b.py")
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("note: A and B ran different scripts (A: model_a.py, B: model_b.py)")
    assert main(["compare", str(a), str(b), "--json"]) == 0
    assert "different scripts" in json.loads(capsys.readouterr().out)["notes"][0]


def test_compare_of_the_same_script_has_no_note(capsys, tmp_path):
    a, b = write_run(tmp_path / "a"), write_run(tmp_path / "b")
    assert main(["compare", str(a), str(b), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["notes"] == []


@pytest.mark.parametrize("cut", ["mid-line", "at a line end"])
def test_a_truncated_program_is_one_clear_error(capsys, tmp_path, cut):
    folder = write_run(tmp_path / "a")
    program = folder / "program.jsonl"
    data = program.read_bytes()
    end = len(data) // 2 if cut == "mid-line" else data.rindex(b"\n", 0, len(data) // 2) + 1
    program.write_bytes(data[:end])
    err = one_error_line(capsys, "compare", str(folder), "--mode", "strict")
    assert "truncated" in err


@pytest.mark.parametrize("content, expected", [
    (bytes(range(256)), "not a tpusim trace (not UTF-8 text)"),
    (b"{}\n", "not a tpusim trace"),
    (b"[]\n", "not a tpusim trace"),
    (b"", "empty trace file"),
    (b'{"schema": "tpusim-trace", "version": 99}\n', "version 99 is not supported; this tpusim reads version 1 "
                                                      "(the file is newer"),
    (b'{"schema": "tpusim-trace", "version": 0}\n', "(the file is older: record it again"),
    (b'{"schema": "tpusim-trace", "version": 1}\n[1, 2]\n', ":2: a record must be a JSON object"),
    (b'{"schema": "tpusim-trace", "version": 1}\n{"kind": "step", "seq": 0, "step": "one"}\n',
     "step.step must be a whole number, not 'one'"),
    (b'{"schema": "tpusim-trace", "version": 1}\n{"kind": "host", "seq": 0, "event": "sync", "seconds": NaN}\n',
     "host.seconds must be a finite number, not nan"),
    (b'{"schema": "tpusim-trace", "version": 1, "world_size": 0}\n', "expected world_size >= 1"),
    # issue 44, R38: numbers no run records were priced into nonsense ("step time 0" beside 6.1e295 s)
    (b'{"schema": "tpusim-trace", "version": 1}\n{"kind": "op", "seq": 0, "op": "aten::mm", "unit": "mxu", '
     b'"dtype": "f32", "flops": 1e308}\n',
     "op.flops must be a number in 0..1e+24, not 1e+308"),
    (b'{"schema": "tpusim-trace", "version": 1}\n{"kind": "op", "seq": 0, "op": "aten::mm", "unit": "mxu", '
     b'"dtype": "f32", "bytes_read": -4}\n',
     "op.bytes_read must be a number in 0..1e+24, not -4"),
    (b'{"schema": "tpusim-trace", "version": 1}\n{"kind": "step", "seq": 0, "step": 1' + b"0" * 30 + b'}\n',
     "step.step must be a whole number of 64 bits"),
])
def test_read_trace_refuses_what_is_not_a_trace(tmp_path, content, expected):
    path = tmp_path / "program.jsonl"
    path.write_bytes(content)
    with pytest.raises(TpusimError) as error:
        read_trace(path)
    assert expected in str(error.value)


def test_read_trace_of_a_folder_or_a_missing_file(tmp_path):
    with pytest.raises(TpusimError, match="is a folder"):
        read_trace(tmp_path)
    with pytest.raises(TpusimError, match="cannot read: No such file"):
        read_trace(tmp_path / "missing.jsonl")


# ---- issue 44: messages that named the wrong cause ----------------------------------------------------------

def test_a_chip_path_that_is_no_file_says_what_it_is(capsys, tmp_path):
    import os

    (tmp_path / "chips").mkdir()
    os.mkfifo(tmp_path / "fifo.toml")
    (tmp_path / "dangling.toml").symlink_to(tmp_path / "nowhere.toml")
    for path, expected in ((tmp_path / "chips", "is a folder"),                     # K13
                           (tmp_path / "fifo.toml", "is not a regular file (a FIFO"),   # K14: and no hang
                           (tmp_path / "dangling.toml", "is a broken symlink"),
                           (tmp_path / "none.toml", "does not exist")):
        assert expected in one_error_line(capsys, "topology", "3d:4x4x4", "--chip", str(path))


def test_an_out_that_is_a_dangling_symlink_is_named_so(capsys, tmp_path):
    # O06: "cannot create the folder: File exists"
    (tmp_path / "out").symlink_to(tmp_path / "gone")
    (tmp_path / "script.py").write_text("")
    err = one_error_line(capsys, "run", str(tmp_path / "script.py"), "--out", str(tmp_path / "out"))
    assert f"--out '{tmp_path / 'out'}' is a broken symlink (to '{tmp_path / 'gone'}')" in err


def test_check_names_a_negative_budget_and_a_junit_folder_that_is_a_file(capsys, tmp_path):
    # H01: `--max-step-time -5ms` was argparse's "expected one argument"; H06: a file where the --junit
    # folder should be was "does not exist"
    with pytest.raises(SystemExit) as stop:
        main(["check", "x.py", "--max-step-time", "-5ms"])
    assert stop.value.code == 2
    assert "--max-step-time '-5ms': must be a positive duration" in capsys.readouterr().err
    (tmp_path / "afile").write_text("")
    err = one_error_line(capsys, "check", "x.py", "--junit", str(tmp_path / "afile" / "inner.xml"))
    assert "its folder" in err and "is not a folder" in err
