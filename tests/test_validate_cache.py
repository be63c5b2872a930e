"""`tpusim validate`'s cache of recordings (tpusim/validate/product.py) when it is damaged or cannot be written (issue
44, rows VC_ro, VC_ro2, VC_truncjson, VC_jsondir, VC_nullreport): a damaged entry is recorded again and replaced,
and a cache that cannot be written is one line, the case recorded in a temporary folder. Each gave a raw
traceback, and a damaged entry failed every later validate until deleted by hand.

One real `tpusim run` records a small script once; the case's command is then replaced by a copy of that run, so
each test sees what a recording writes without the minutes a case's own recording takes. Never the shared
~/.cache/tpusim: XDG_CACHE_HOME is each test's own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tpusim.validate import product
from tpusim.validate.product import PRODUCT_RUNS, cached_folder, recording

ROOT = Path(__file__).resolve().parents[1]
RUN = next(r for r in PRODUCT_RUNS if r.eager == "fused")      # the recording below prices Fused eager


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """A folder a real `tpusim run` wrote."""
    folder = tmp_path_factory.mktemp("recorded")
    script = folder / "step.py"
    script.write_text("import torch, tpusim.backend\nx = torch.ones(8, 8, device='tpu')\n(x @ x).sum()\n"
                      "tpusim.backend.step()\n")
    done = subprocess.run([sys.executable, "-m", "tpusim", "run", str(script), "--compiler", "model", "--mode",
                           "fused", "--quiet", "--out", str(folder / "run")], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return folder / "run"


@pytest.fixture
def cache(tmp_path, monkeypatch, recorded) -> list[Path]:
    """The case's recording command copies ``recorded`` to where it is asked to write; returns where it wrote."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(product, "_NOT_KEPT", [])
    recording.cache_clear()
    wrote = []

    def command(run, out: Path) -> list[str]:
        wrote.append(out)
        return [sys.executable, "-c", "import shutil, sys; shutil.copytree(sys.argv[1], sys.argv[2])", str(recorded),
                str(out)]

    monkeypatch.setattr(product, "command", command)
    yield wrote
    recording.cache_clear()


def damage(folder: Path, how: str) -> None:
    report = folder / "report.json"
    if how == "truncated":
        report.write_bytes(report.read_bytes()[:200])
    elif how == "null":
        report.write_text("null")
    elif how == "a folder":
        report.unlink()
        report.mkdir()
    elif how == "program cut short":
        program = folder / "program.jsonl"
        program.write_bytes(program.read_bytes()[:-30])
    elif how == "not a report":
        report.write_text('{"modes": 5}')


@pytest.mark.parametrize("how", ["truncated", "null", "a folder", "program cut short", "not a report"])
def test_a_damaged_entry_is_recorded_again_and_replaced(cache, recorded, how):
    trace, report = recording(RUN)
    assert len(cache) == 1 and report == json.loads((recorded / "report.json").read_text())
    entry = cached_folder(RUN)
    damage(entry, how)
    recording.cache_clear()
    trace, report = recording(RUN)                       # a traceback before: JSONDecodeError, TypeError, ...
    assert len(cache) == 2 and report == json.loads((recorded / "report.json").read_text())
    assert trace.records and (entry / "report.json").read_text() == (recorded / "report.json").read_text()
    assert [p.name for p in entry.parent.iterdir()] == [entry.name]          # no scratch or damaged copy left
    recording.cache_clear()
    recording(RUN)
    assert len(cache) == 2                               # read from the cache: the entry is whole again


@pytest.mark.parametrize("where", ["a file", "under /proc"])
def test_a_cache_that_cannot_be_written_is_one_line_and_the_case_still_records(cache, recorded, tmp_path, capsys,
                                                                                monkeypatch, where):
    if where == "a file":
        (tmp_path / "xdg").write_text("not a folder")
    else:
        monkeypatch.setenv("XDG_CACHE_HOME", "/proc/tpusim-cannot-be-created")
    trace, report = recording(RUN)
    assert report == json.loads((recorded / "report.json").read_text()) and trace.records
    recording.cache_clear()
    recording(RUN)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tpusim validate: cannot write the recordings' cache ")
    assert "recording in a temporary folder, not kept" in err and "Traceback" not in err
    assert len(cache) == 2 and not any(out.parent.exists() for out in cache)     # the temporary folders removed
