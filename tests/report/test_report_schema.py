"""report.json is one typed model (tpusim/report/schema.py): written from it, its JSON Schema generated from it
and written beside it, read back into it unchanged; report.html from an autoescaped Jinja2 template."""

import json
import re

import pytest
from factories import training_trace

from tpusim.eager.modes import get_mode
from tpusim.errors import TpusimError
from tpusim.pricing import price
from tpusim.report import Report, RunInfo, build_report, json_schema, load_report, report_json, write_report
from tpusim.report.html import render_html
from tpusim.slice.topology import build_slice


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    trace, slice_ = training_trace(), build_slice("3d:1x1x1")
    timelines = {mode: price(trace, topology=slice_, mode=get_mode(mode)) for mode in ("strict", "fused")}
    report = build_report(RunInfo("model.py", argv=("--steps", "3")), trace, slice_, timelines)
    return report, write_report(tmp_path_factory.mktemp("schema"), report, timelines)


def test_the_report_is_the_typed_model_and_report_json_its_dump(written):
    report, out = written
    assert isinstance(report, Report) and report.schema_ == "tpusim-report"
    assert report.modes["strict"].hbm.peak_bytes > 0 and report.run.argv == ["--steps", "3"]
    text = (out / "report.json").read_text()
    assert text == report_json(report) == json.dumps(report.to_dict(), indent=1, sort_keys=True) + "\n"


def test_a_loaded_report_writes_back_the_same_bytes(written):
    _, out = written
    loaded, folder = load_report(out)
    assert folder == out and report_json(loaded) == (out / "report.json").read_text()


def test_the_json_schema_is_written_beside_report_json_and_validates_it(written):
    jsonschema = pytest.importorskip("jsonschema")
    _, out = written
    schema = json.loads((out / "report.schema.json").read_text())
    assert schema == json.loads(json.dumps(json_schema()))
    assert schema["$id"] == "tpusim-report" and "modes" in schema["required"]
    data = json.loads((out / "report.json").read_text())
    jsonschema.validate(data, schema)
    data["modes"]["strict"]["host_s"]["stall"] = "slow"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, schema)


def test_the_loader_refuses_what_the_schema_refuses_naming_the_path(written, tmp_path):
    _, out = written
    data = json.loads((out / "report.json").read_text())
    data["modes"]["fused"]["hbm"]["peak_bytes"] = float("inf")
    (tmp_path / "report.json").write_text(json.dumps(data))
    with pytest.raises(TpusimError, match="modes.fused.hbm.peak_bytes must be a finite number, not inf"):
        load_report(tmp_path)
    data["modes"]["fused"]["hbm"]["peak_bytes"] = 1
    del data["modes"]["strict"]["device_s"]["collective_exposed"]
    (tmp_path / "report.json").write_text(json.dumps(data))
    with pytest.raises(TpusimError, match="not a complete tpusim report: modes.strict.device_s.collective_exposed is"):
        load_report(tmp_path)
    del data["program"]
    (tmp_path / "report.json").write_text(json.dumps(data))
    with pytest.raises(TpusimError, match="not a complete tpusim report: program is missing"):
        load_report(tmp_path)


@pytest.mark.parametrize("path, value, expected", [
    # issue 44, R39/W19: an integer past float's range raised OverflowError in math.isfinite (compare, sweep)
    (("chip", "hbm_bytes_per_s"), 10**400, "a number too long"),
    (("modes", "strict", "kernels"), 10**400, "a number too long"),   # any integer field, as the JSON is read
    (("modes", "strict", "hbm", "peak_bytes"), -(10**400), "a number too long"),
    # RC_neg_hbm: a negative or zero rate was accepted and divided by
    (("chip", "hbm_bytes_per_s"), -1, "chip.hbm_bytes_per_s must be a finite number > 0, not -1"),
    (("chip", "peak_bf16_flops_per_s"), 0, "chip.peak_bf16_flops_per_s must be a finite number > 0, not 0"),
], ids=["huge-rate", "huge-count", "huge-negative", "negative-rate", "zero-peak"])
def test_a_number_no_reader_can_use_is_refused_in_one_line(written, tmp_path, path, value, expected):
    _, out = written
    data = json.loads((out / "report.json").read_text())
    part = data
    for key in path[:-1]:
        part = part[key]
    part[path[-1]] = value
    (tmp_path / "report.json").write_text(json.dumps(data))
    with pytest.raises(TpusimError, match=re.escape(expected)):
        load_report(tmp_path)


def test_the_schema_refuses_a_number_past_float_range_given_as_data(written, tmp_path):
    from tpusim.report.load import check_report

    _, out = written
    data = json.loads((out / "report.json").read_text())
    data["modes"]["strict"]["hbm"]["peak_bytes"] = 10**400
    with pytest.raises(TpusimError, match=re.escape("modes.strict.hbm.peak_bytes must be a number within +-1.8e308")):
        check_report(data, tmp_path / "report.json")


def test_the_page_escapes_what_the_report_holds(written):
    report, _ = written
    data = report.to_dict()
    data["run"]["script"] = "<script>alert(1)</script>.py"
    page = render_html(Report.model_validate(data), {})
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;.py" in page
