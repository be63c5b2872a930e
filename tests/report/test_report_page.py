"""report.html and its figures as a colleague sees them (issue 31, item 5): a roof per dtype on the roofline,
whole chip coordinates on the link heat map, ratios that say of what; and the page itself in a real headless
Chromium: no console errors, the headline cards and every figure visible, a screenshot kept as an artefact.

The browser test needs Debian's ``chromium`` (``/usr/bin/chromium``, or TPUSIM_CHROMIUM) and the ``playwright``
package of the test extra; it is skipped where Chromium is missing, except under ``.ci/run``, which installs
Chromium and sets TPUSIM_REQUIRE_BROWSER=1 so that a missing browser fails instead.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tpusim.eager.modes import get_mode
from tpusim.pricing import price
from tpusim.report import RunInfo, build_report, write_report
from tpusim.report.load import load_report
from tpusim.report.plots import link_heatmap, mode_comparison, roofline
from tpusim.slice.topology import build_slice
from tpusim.trace.records import CollectiveRecord, OpRecord, StepMarker, TensorMeta, Trace, renumber

ARTEFACTS = Path(os.environ.get("TPUSIM_TEST_ARTEFACTS", Path(__file__).resolve().parents[2] / "test-artefacts"))


def _tensor(key: int, shape: tuple[int, ...], dtype: str) -> TensorMeta:
    size = {"bfloat16": 2, "float32": 4}[dtype]
    count = 1
    for dim in shape:
        count *= dim
    return TensorMeta(key, shape, dtype, count * size, key)


def _matmul(dtype: str, base: int, source: str) -> OpRecord:
    a, b, c = _tensor(base, (512, 1024), dtype), _tensor(base + 1, (1024, 512), dtype), _tensor(base + 2, (512, 512),
                                                                                                 dtype)
    return OpRecord(0, "aten::mm", "mxu", dtype, (a, b), (c,), flops=2 * 512 * 1024 * 512,
                    bytes_read=a.nbytes + b.nbytes, bytes_written=c.nbytes, matmul=(1, 512, 1024, 512), source=source)


def mixed_trace(steps: int = 3) -> Trace:
    """Each step: a bf16 and a float32 matmul, then an all-reduce over the 2x2 slice (data parallelism)."""
    grad = _tensor(50, (2**20,), "float32")
    records = []
    for step in range(steps):
        records += [_matmul("bfloat16", 10, "train.py:3"), _matmul("float32", 20, "train.py:4"),
                    CollectiveRecord(0, "all_reduce", grad.nbytes, inputs=(grad,), outputs=(grad,),
                                     source="train.py:6"), StepMarker(0, step)]
    return Trace(renumber(records), world_size=4)


@pytest.fixture(scope="module")
def report_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    trace, slice_ = mixed_trace(), build_slice("2d:2x2", "v5e")
    timelines = {mode: price(trace, topology=slice_, mode=get_mode(mode)) for mode in ("debug", "strict", "fused")}
    folder = tmp_path_factory.mktemp("report")
    write_report(folder, build_report(RunInfo("train.py", topology="2d:2x2"), trace, slice_, timelines), timelines)
    return folder


def test_the_roofline_draws_a_roof_per_dtype_its_ops_ran_in(report_folder: Path) -> None:
    report, _ = load_report(report_folder)
    figure = roofline(report)
    roofs = {kind: max(line.get_ydata()) for line in figure.axes[0].get_lines()
             for kind in line.get_label().split()[0].split("/")}
    peaks = report.chip.peak_flops_per_s
    assert roofs == pytest.approx({"bf16": peaks["bf16"], "f32": peaks["f32"]})
    listed = [t.get_text() for t in figure.axes[0].texts if t.get_text().startswith("costliest ops")]
    assert listed and "mm (float32)" in listed[0] and "mm (bfloat16)" in listed[0]


def test_the_heat_map_has_whole_chip_coordinates_on_both_axes(report_folder: Path) -> None:
    report, _ = load_report(report_folder)
    figure = link_heatmap(report)
    assert figure is not None
    for ax in figure.axes[:-1]:                      # the last axes is the colour bar
        ticks = [*ax.get_xticks(), *ax.get_yticks()]
        shown = [t for t in ticks if -0.5 <= t <= 1.5]
        assert shown and all(float(t).is_integer() for t in shown), ticks
        assert ax.get_xlabel() == "chip x" and ax.get_ylabel() == "chip y"


def test_the_mode_ratio_says_what_it_is_a_ratio_of(report_folder: Path) -> None:
    report, _ = load_report(report_folder)
    labels = [t.get_text() for t in mode_comparison(report).axes[0].texts]
    slowest = max(report.modes, key=lambda m: report.modes[m].step_time_median_s)
    assert [label for label in labels if f"x faster than {slowest}" in label]
    assert not [label for label in labels if label.rstrip().endswith("x")]


# Each figure's rendered box against the page's content box (the body less its padding), in CSS pixels; and
# the page itself no wider than the window (nothing to scroll sideways for).
FIGURES_PAST_THE_CONTENT = """() => {
  const body = document.body.getBoundingClientRect(), style = getComputedStyle(document.body);
  const left = body.left + parseFloat(style.paddingLeft), right = body.right - parseFloat(style.paddingRight);
  const out = [...document.images].map(image => [image.alt || image.src.slice(0, 60),
                                                 image.getBoundingClientRect()])
    .filter(([, box]) => box.width <= 0 || box.left < left - 0.5 || box.right > right + 0.5)
    .map(([name, box]) => `${name}: ${box.left}..${box.right} outside ${left}..${right}`);
  if (document.documentElement.scrollWidth > window.innerWidth)
    out.push(`page ${document.documentElement.scrollWidth} px wide in a ${window.innerWidth} px window`);
  return out;
}"""


def _chromium() -> str | None:
    return os.environ.get("TPUSIM_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


def test_report_html_in_a_headless_browser(report_folder: Path) -> None:
    browser_path = _chromium()
    if browser_path is None:
        if os.environ.get("TPUSIM_REQUIRE_BROWSER") == "1":
            pytest.fail("TPUSIM_REQUIRE_BROWSER=1 but no chromium on PATH (.ci/run installs Debian's chromium)")
        pytest.skip("no chromium on this machine (apt-get install chromium); .ci/run installs it")
    sync_api = pytest.importorskip("playwright.sync_api", reason="the test extra's playwright")
    errors: list[str] = []
    with sync_api.sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=browser_path, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto((report_folder / "report.html").as_uri())
            page.wait_for_load_state("load")
            cards = page.locator(".card")
            assert cards.count() >= 4 and all(cards.nth(i).is_visible() for i in range(cards.count()))
            assert "step time" in page.locator(".cards").inner_text()
            figures = page.locator("img")
            drawn = page.evaluate("[...document.images].map(i => i.complete && i.naturalWidth > 0)")
            assert figures.count() >= 4 and all(drawn)
            assert all(figures.nth(i).is_visible() for i in range(figures.count()))
            overflow = page.evaluate(FIGURES_PAST_THE_CONTENT)      # issue 45 item 7: by pixel bounds
            assert overflow == [], overflow
            ARTEFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTEFACTS / "report_html.png"), full_page=True)
        finally:
            browser.close()
    assert errors == []
    assert (ARTEFACTS / "report_html.png").stat().st_size > 10_000
