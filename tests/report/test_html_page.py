"""report.html is one self-contained, valid page readable at a glance: headline cards, the verdict, the per-mode
table with every row the terminal shows, collapsible tables, grouped collectives; checked by a strict HTML5
parser and, where a headless Chromium is installed, rendered in it (a screenshot, no console errors)."""

import shutil
import subprocess

import html5lib
import pytest
from test_links_and_collectives import tp_trace

from tpusim.eager.modes import get_mode
from tpusim.pricing import price
from tpusim.report import RunInfo, build_report, write_report
from tpusim.report.lint import lint
from tpusim.report.summary import mode_rows
from tpusim.slice.topology import build_slice

BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome")


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    trace, slice_ = tp_trace(), build_slice("3d:4x4x4", "v5p")
    timelines = {mode: price(trace, topology=slice_, mode=get_mode(mode)) for mode in ("strict", "fused")}
    report = build_report(RunInfo("tp.py", tokens_per_step=8192), trace, slice_, timelines,
                          lint(trace, slice_.chip, timelines["fused"]))
    out = write_report(tmp_path_factory.mktemp("html"), report, timelines)
    return out / "report.html", report


def test_the_page_is_valid_html5_with_nothing_external(page):
    path, _ = page
    text = path.read_text()
    html5lib.HTMLParser(strict=True).parse(text)          # raises on any parse error
    assert "src=\"http" not in text and "href=\"http" not in text and "<script" not in text


def test_headline_verdict_and_every_summary_row_are_on_the_page(page):
    path, report = page
    text = path.read_text()
    head = report.modes["fused"].headline
    for card in ("tokens/s per chip", "TFLOP/s per chip", "HFU (every FLOP run)", "HBM peak", "exposed communication",
                 "bound by"):
        assert f">{card}<b>" in text
    assert html_escape(head.verdict) in text
    for label, _ in mode_rows(report.modes, list(report.modes)):
        assert f"<td>{html_escape(label)}</td>" in text          # host compile, host dispatch, HBM bytes, ...


def test_tables_collapse_and_collectives_are_grouped(page):
    path, report = page
    text = path.read_text()
    assert text.count("<details") >= 4 and text.count("<details") == text.count("</details>")
    calls = len(report.modes["fused"].collectives)
    groups = len(report.modes["fused"].collective_groups)
    assert groups == 2 < calls and f"{calls} calls in {groups} groups" in text


@pytest.mark.skipif(not any(shutil.which(b) for b in BROWSERS), reason="no headless Chromium installed "
                    "(apt-get install chromium-headless-shell)")
def test_a_headless_browser_renders_it_without_console_errors(page, tmp_path):
    path, _ = page
    browser = next(shutil.which(b) for b in BROWSERS if shutil.which(b))
    shot = tmp_path / "report.png"
    run = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
                          f"--screenshot={shot}", "--window-size=1200,2000", path.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    console = [line for line in run.stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]
    assert console == []


def html_escape(text: str) -> str:
    import html

    return html.escape(text)
