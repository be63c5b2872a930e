"""Who builds the programs tpusim prices (--compiler auto|xla|model), decided without running any compiler:
auto uses the TPU compiler only where the xla extra is installed; without it the report and the terminal
say so in one line, for eager runs too; --compiler xla without the extra is bad input before the script runs."""

from __future__ import annotations

import pytest

from tpusim.errors import TpusimError
from tpusim.pricing.compiled import ask_compiler
from tpusim.report.xla import xla_lines
from tpusim.run import pipeline
from tpusim.run.options import RunOptions
from tpusim.trace.records import OpRecord, Trace, TraceMeta, XlaModule
from tpusim.xla import compiler, programs

NO_EXTRA = ('libtpu is not installed; the xla extra (pip install -e ".[xla]") prices each program as the real TPU '
            'compiler builds it')
TRACE = Trace(records=(), meta=TraceMeta(xla_modules=(XlaModule("graph 0 (forward)", "module {}", (1, 3)),)))


@pytest.fixture
def no_extra(monkeypatch):
    monkeypatch.setattr(compiler, "missing", lambda: NO_EXTRA)
    monkeypatch.setattr(programs, "missing", lambda: NO_EXTRA)


def test_auto_without_the_extra_falls_back_with_one_reason(no_extra):
    estimates = ask_compiler(TRACE, None, "auto")
    assert not estimates.priced and estimates.fell_back == (f"graph 0 (forward): {NO_EXTRA}",)


def test_no_compiled_graph_no_compiler_section():
    assert ask_compiler(Trace(records=()), None, "auto") is None


def test_an_eager_run_without_the_extra_says_what_it_would_add(no_extra):
    op = OpRecord(0, "aten::mm", "mxu", "float32")
    estimates = ask_compiler(Trace(records=(op,)), None, "auto")
    assert estimates.fell_back == (f"eager ops: {NO_EXTRA}",)
    assert ask_compiler(Trace(records=(op,)), None, "model") is None


def test_model_is_never_the_compiler(monkeypatch):
    monkeypatch.setattr(programs, "missing", lambda: None)
    estimates = ask_compiler(TRACE, None, "model")
    assert estimates.fell_back == ("graph 0 (forward): --compiler model",)


def test_compiler_xla_without_the_extra_is_refused_before_the_script_runs(no_extra, tmp_path):
    script = tmp_path / "m.py"
    script.write_text("raise SystemExit('the script ran')\n")
    with pytest.raises(TpusimError, match=r"--compiler xla: libtpu is not installed; the xla extra"):
        pipeline.run_pipeline(RunOptions(script=str(script), compiler="xla", out=str(tmp_path / "out")))


def test_the_terminal_line_without_the_compiler():
    from tpusim.report.schema import ModeSection, XlaSection

    mode = ModeSection.model_construct(total_s=1.0, compiler="model", xla=XlaSection(fell_back=[f"g: {NO_EXTRA}"]))
    report = type("R", (), {"modes": {"strict": mode}})()
    assert xla_lines(report) == [f"TPU compiler: not used ({NO_EXTRA})"]


@pytest.fixture
def extra_installed(monkeypatch):
    monkeypatch.setattr(programs, "missing", lambda: None)


def bands(monkeypatch, **by_key):
    monkeypatch.setattr(programs, "error_bands", lambda: {k.replace("_at_", "@"): v for k, v in by_key.items()})


def test_auto_leaves_an_unvalidated_compiler_path_alone(extra_installed, monkeypatch):
    bands(monkeypatch, compile=MODEL)
    assert not programs.use_compiler("auto") and programs.use_compiler("xla")
    assert "tpusim validate --compiler xla --write-bands" in programs.auto_declined()
    estimates = ask_compiler(TRACE, None, "auto")
    assert not estimates.priced and "has not" in estimates.fell_back[0]


MODEL = {"cases": 13, "mean_abs_error": 0.045}


def test_auto_takes_the_path_closer_to_published_runs(extra_installed, monkeypatch):
    bands(monkeypatch, compile=MODEL, compile_at_xla={"cases": 13, "mean_abs_error": 0.2})
    assert not programs.use_compiler("auto")
    assert "±4.5% over 13 cases" in programs.auto_declined() and "±20.0% over 13" in programs.auto_declined()
    bands(monkeypatch, compile=MODEL, compile_at_xla={"cases": 13, "mean_abs_error": 0.03})
    assert programs.use_compiler("auto") and programs.auto_declined() is None
