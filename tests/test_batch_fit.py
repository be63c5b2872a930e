"""`--fit-batch ARG` (tpusim/run/batch_fit.py): the largest value of the script's batch argument whose HBM peak fits
the chip, per mode. The search is checked against a brute-force scan of known peak curves; the run's answer against
`tpusim run` itself at that batch and the next (slow: each is a fresh torch process)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from factories import training_trace

from tpusim.cli.check import summarise
from tpusim.cli.main import _negative_values, build_parser
from tpusim.eager.modes import get_mode
from tpusim.errors import TpusimError
from tpusim.pricing import price
from tpusim.report import RunInfo, build_report, load_report, report_json, summary_table, write_report
from tpusim.report.html import render_html
from tpusim.run import batch_fit
from tpusim.run.batch_fit import MAX_BATCH, RECORDINGS, BatchSearch, Fitter, batch_argument, with_batch
from tpusim.run.options import RunOptions
from tpusim.run.pipeline import run_pipeline
from tpusim.run.progress import Progress
from tpusim.script import ScriptOutcome
from tpusim.slice.topology import build_slice

GIB = 2**30
CAPACITY = 16 * GIB


def _affine(b: int) -> int:
    return 5 * GIB + 3_000_000 * b


CURVES = {   # peak(batch) shapes a training step gives; None: the recording ran out of memory
    "affine": _affine,
    "rounded to 2 MiB blocks": lambda b: 5 * GIB + math.ceil(3_000_000 * b / 2**21) * 2**21,
    "three tensors rounded to 512 B": lambda b: 5 * GIB + sum(math.ceil(b * k / 512) * 512
                                                              for k in (1_000_000, 700_000, 1_300_000)),
    "flat, then activations": lambda b: max(6 * GIB, 2 * GIB + 250_000 * b),
    "slightly convex": lambda b: 4 * GIB + 3_000_000 * b + 20 * b * b,
    "out of memory above the capacity": lambda b: None if _affine(b) > CAPACITY else _affine(b),
}


def scanned(curve) -> int:
    """The truth: the largest batch whose peak fits, by trying every batch from 1."""
    best = 0
    for batch in range(1, MAX_BATCH + 1):
        peak = curve(batch)
        if peak is None or peak > CAPACITY:
            break
        best = batch
    return best


def searched(curve, start: int, modes=("strict",)) -> tuple[BatchSearch, dict]:
    search = BatchSearch(lambda b: None if curve(b) is None else dict.fromkeys(modes, curve(b)), modes, CAPACITY)
    return search, search.all_modes(start)


@pytest.mark.parametrize("name", CURVES)
@pytest.mark.parametrize("start", [1, 64, 3000, 10**6])
def test_the_search_finds_what_a_scan_of_every_batch_finds(name, start):
    curve = CURVES[name]
    search, fits = searched(curve, start)
    fit = fits["strict"]
    assert fit.exact and fit.value == scanned(curve)
    assert search.recordings <= RECORDINGS
    assert fit.peak_bytes == curve(fit.value) <= CAPACITY
    assert fit.next_peak_bytes == curve(fit.value + 1) and (curve(fit.value + 1) or CAPACITY + 1) > CAPACITY


def test_a_near_affine_peak_takes_two_points_and_the_confirming_pair():
    search, fits = searched(_affine, 64)
    assert sorted(search.points) == [64, 128, fits["strict"].value, fits["strict"].value + 1]


def test_a_peak_that_does_not_grow_with_the_batch_stops_at_the_largest_batch_tried():
    search, fits = searched(lambda b: 2 * GIB, 8)
    assert fits["strict"].value == MAX_BATCH and not fits["strict"].exact and search.recordings <= 3


def test_when_not_even_one_fits_the_value_is_zero():
    _, fits = searched(lambda b: CAPACITY + b, 8)
    assert fits["strict"].value == 0 and fits["strict"].exact and fits["strict"].peak_bytes is None


def test_modes_share_the_recordings_and_get_their_own_answers():
    peaks = {"strict": lambda b: 5 * GIB + 3_000_000 * b, "fused": lambda b: 4 * GIB + 2_500_000 * b}
    search = BatchSearch(lambda b: {mode: f(b) for mode, f in peaks.items()}, list(peaks), CAPACITY)
    fits = search.all_modes(64)
    assert {mode: fit.value for mode, fit in fits.items()} == {mode: scanned(f) for mode, f in peaks.items()}
    assert all(fit.exact for fit in fits.values()) and search.recordings <= search.max_recordings == RECORDINGS + 2


def test_a_search_the_cap_stops_gives_a_batch_that_fits_and_says_it_is_no_exact_answer():
    def steps(b):
        return GIB + (b // 64) * 2**28           # a peak in big steps: the secant cannot close in on it
    search, fits = searched(steps, 1)
    fit = fits["strict"]
    assert search.recordings == RECORDINGS and not fit.exact
    assert 0 < fit.value <= scanned(steps) and steps(fit.value) <= CAPACITY


@pytest.mark.parametrize(("name", "args", "flag", "value"), [
    ("batch", ["--batch", "8"], "--batch", 8),
    ("--batch", ["--steps", "2", "--batch=16"], "--batch", 16),
    ("batch-size", ["--batch-size", "4", "--batch-size", "32"], "--batch-size", 32),   # the last, as argparse
    ("-b", ["-b", "3"], "-b", 3),
])
def test_the_batch_argument_is_read_as_the_script_reads_it(name, args, flag, value):
    assert batch_argument(name, args) == batch_fit.BatchArgument(flag, value)


@pytest.mark.parametrize(("args", "message"), [
    (["--batch-size", "8"], "--fit-batch batch: the script arguments after -- hold no --batch; give its batch "
                            "argument, e.g. -- --batch 8"),
    ([], "hold no --batch"),
    (["--batch", "eight"], "--fit-batch batch: --batch 'eight' is not a whole number >= 1"),
    (["--batch=0"], "--batch '0' is not a whole number >= 1"),
    (["--batch"], "--batch '' is not a whole number >= 1"),
])
def test_a_batch_argument_the_script_arguments_do_not_give_is_refused(args, message):
    with pytest.raises(TpusimError, match=message.replace("(", r"\(")):
        batch_argument("batch", args)


def test_the_batch_is_changed_where_the_arguments_give_it_and_nowhere_else():
    args = ("--batch", "8", "--batch-size", "8", "--steps=8", "--batch=8")
    assert with_batch(args, "--batch", 64) == ("--batch", "64", "--batch-size", "8", "--steps=8", "--batch=64")


def _parsed(argv: list[str]) -> RunOptions:
    script_args = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:len(argv) - len(script_args) - (1 if "--" in argv else 0)]
    parser = build_parser()
    args = parser.parse_args(_negative_values(parser, own))
    args.script_args = script_args
    return RunOptions.from_args(args)


def test_the_flag_takes_the_script_flag_as_its_value_and_round_trips_through_the_command_line():
    options = _parsed(["run", "train.py", "--fit-batch", "--batch", "--quiet", "--", "--batch", "8"])
    assert options.fit_batch == "--batch" and options.quiet and options.script_args == ("--batch", "8")
    assert _parsed(options.argv()[3:]) == options
    assert _parsed(["run", "train.py", "--fit-batch", "batch"]).fit_batch == "batch"


def test_a_missing_batch_argument_stops_the_run_before_the_script_runs(tmp_path):
    ran = tmp_path / "ran"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(ran)!r}, 'w').close()\n")
    for args, message in ((("--width", "8"), "hold no --batch"), (("--batch", "x8"), "'x8' is not a whole number")):
        with pytest.raises(TpusimError, match=message):
            run_pipeline(RunOptions(script=str(script), script_args=args, fit_batch="batch", quiet=True,
                                    out=str(tmp_path / "out")))
    assert not ran.exists() and not (tmp_path / "out").exists()


class _FakeRuns:
    """run_fresh as the search calls it: writes the report a `tpusim run` at that batch would (its peak from
    ``curve``; an out-of-memory error or another error where ``curve`` says so), and keeps what it was asked."""

    def __init__(self, curve):
        self.curve, self.asked = curve, []

    def __call__(self, options: RunOptions, *, env, cwd) -> str | None:
        self.asked.append((options, env, cwd))
        batch = int(options.script_args[options.script_args.index("--batch") + 1])
        peak = self.curve(batch)
        out = Path(options.out)
        out.mkdir(parents=True)
        error = None if isinstance(peak, int) else {"type": peak, "traceback": f"Traceback:\n{peak}: at {batch}\n"}
        modes = {m.name: {"hbm": {"peak_bytes": peak if error is None else 1, "capacity_bytes": CAPACITY}}
                 for m in options.modes}
        (out / "report.json").write_text(json.dumps({"error": error, "modes": modes}))
        return None if error is None else "recording failed (exit 1): the script raised"


def _fitter(monkeypatch, tmp_path, curve) -> tuple[Fitter, _FakeRuns]:
    runs = _FakeRuns(curve)
    monkeypatch.setattr(batch_fit, "run_fresh", runs)
    monkeypatch.delenv("TPUSIM_HBM_BYTES", raising=False)
    options = RunOptions(script="train.py", script_args=("--batch", "8", "--steps", "2"), chip="v5e",
                         modes=(get_mode("strict"), get_mode("fused")), fit_batch="--batch", max_records=500)
    return Fitter(options, tmp_path / "train.py", "v5e", CAPACITY, Progress(quiet=True)), runs


def test_the_run_records_each_batch_shape_only_with_unlimited_hbm_and_reads_its_report(monkeypatch, tmp_path):
    fitter, runs = _fitter(monkeypatch, tmp_path, lambda b: "OutOfMemoryError" if _affine(b) > CAPACITY else _affine(b))
    found = fitter(["strict", "fused"], ScriptOutcome(exit_code=0))
    truth = scanned(_affine)
    assert found["strict"] == {"argument": "--batch", "value": truth, "exact": True, "peak_bytes": _affine(truth),
                               "next_peak_bytes": None, "capacity_bytes": CAPACITY, "recordings": len(runs.asked)}
    assert found["fused"]["value"] == truth
    options, env, cwd = runs.asked[0]
    assert (options.numerics, options.ranks, options.compiler, options.quiet) == ("off", "one", "model", True)
    assert options.script_args == ("--batch", "8", "--steps", "2") and options.script == str(tmp_path / "train.py")
    assert options.mode_names == ("strict", "fused") and options.chip == "v5e" and options.max_records == 500
    assert env["TPUSIM_HBM_BYTES"] == "0" and cwd == str(Path.cwd())
    assert options.fit_batch is None                      # the recordings search nothing themselves


def test_a_script_that_fails_at_a_batch_for_another_reason_stops_the_search(monkeypatch, tmp_path):
    fitter, runs = _fitter(monkeypatch, tmp_path, lambda b: "ValueError" if b > 8 else _affine(b))
    with pytest.raises(TpusimError, match=r"--fit-batch --batch: the script failed at --batch 16 "
                                          r"\(ValueError: at 16\); no largest batch was found"):
        fitter(["strict", "fused"], ScriptOutcome(exit_code=0))


def test_a_run_whose_script_failed_but_for_memory_is_not_searched(monkeypatch, tmp_path):
    fitter, runs = _fitter(monkeypatch, tmp_path, _affine)
    assert fitter(["strict"], ScriptOutcome(exit_code=1, error_type="ValueError")) is None and not runs.asked
    assert fitter(["strict"], ScriptOutcome(exit_code=1, error_type="OutOfMemoryError"))["strict"]["exact"]


def test_the_report_the_table_the_page_and_check_carry_the_largest_batch(tmp_path):
    trace, slice_ = training_trace(), build_slice("3d:1x1x1", "v5p")
    timelines = {mode: price(trace, topology=slice_, mode=get_mode(mode)) for mode in ("strict", "fused")}
    fit = {"argument": "--batch", "value": 412, "exact": True, "peak_bytes": 95 * GIB, "next_peak_bytes": 96 * GIB,
           "capacity_bytes": 95 * GIB + 1, "recordings": 4}
    report = build_report(RunInfo("train.py"), trace, slice_, timelines,
                          largest_batch={"strict": fit, "fused": {**fit, "value": 65536, "exact": False}})
    assert report.modes["strict"].largest_batch.value == 412
    row = next(line for line in summary_table(report, "out").splitlines() if line.startswith("largest batch (fits)"))
    assert row.split()[3:] == ["412", "(--batch)", ">=", "65536", "(--batch)"]
    assert "largest batch (fits)" in render_html(report, {})
    out = write_report(tmp_path, report, timelines)
    loaded, _ = load_report(out)
    assert report_json(loaded) == report_json(report) and json.loads(report_json(report))["modes"]["strict"][
        "largest_batch"] == fit
    assert summarise(report, [], 0, "out")["modes"]["strict"]["largest_batch"] == fit
    ran_out = build_report(RunInfo("train.py", error_type="OutOfMemoryError", error_traceback="OutOfMemoryError\n",
                                   exit_code=1), trace, slice_, timelines, largest_batch={"strict": fit})
    lines = summary_table(ran_out, "out").splitlines()   # no table when the script raised: the answer as a line
    assert "raised OutOfMemoryError" in lines[0] and lines[1] == "largest batch (fits): strict 412 (--batch)"
    plain = build_report(RunInfo("train.py"), trace, slice_, timelines)
    assert "largest_batch" not in json.loads(report_json(plain))["modes"]["strict"]
    assert "largest batch" not in summary_table(plain, "out")
    assert "largest_batch" not in summarise(plain, [], 0, "out")["modes"]["strict"]


WIDE = '''\
import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--batch", type=int, default=8)
parser.add_argument("--width", type=int, default=16384)
parser.add_argument("--fail-above", type=int, default=0)
args = parser.parse_args()
if args.fail_above and args.batch > args.fail_above:
    raise ValueError(f"this script takes no batch above {args.fail_above}")
w1 = torch.nn.Parameter(torch.empty(args.width, args.width, device="tpu"))
w2 = torch.nn.Parameter(torch.empty(args.width, args.width, device="tpu"))
optimizer = torch.optim.SGD([w1, w2], lr=0.1)
x = torch.empty(args.batch, 4, args.width, device="tpu")     # activations grow with the batch
(torch.relu(x @ w1) @ w2).sum().backward()
optimizer.step()
'''


def _tpusim(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tpusim", *argv], capture_output=True, text=True, timeout=1800)


@pytest.mark.slow   # 6-8 `tpusim run` processes (a fresh torch each): 20-90 s apiece on 2 busy cores
def test_the_largest_batch_fits_and_the_next_does_not_by_tpusim_run_itself(tmp_path):
    script = tmp_path / "wide.py"
    script.write_text(WIDE)
    flags = ["--chip", "v5e", "--mode", "strict", "--numerics", "off"]   # one mode: modes share the recordings
    done = _tpusim("run", str(script), *flags, "--out", str(tmp_path / "run"), "--fit-batch", "--batch",
                   "--", "--batch", "8")
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    fits = {mode: entry["largest_batch"] for mode, entry in report["modes"].items()}
    assert "largest batch (fits)" in done.stdout and "fit batch: recording --batch" in done.stderr
    fit = fits["strict"]
    assert fit["exact"] and fit["argument"] == "--batch" and 8 < fit["value"] < MAX_BATCH
    assert fit["recordings"] <= RECORDINGS
    alone = {}                                            # the truth: tpusim run alone, the chip's HBM its limit
    for batch in (fit["value"], fit["value"] + 1):
        out = tmp_path / f"batch-{batch}"
        _tpusim("run", str(script), *flags, "--quiet", "--out", str(out), "--", "--batch", str(batch))
        alone[batch] = json.loads((out / "report.json").read_text())
    fitting, next_one = alone[fit["value"]], alone[fit["value"] + 1]
    hbm = fitting["modes"]["strict"]["hbm"]
    assert fitting["complete"] and hbm["peak_bytes"] == fit["peak_bytes"] <= hbm["capacity_bytes"]
    assert hbm["capacity_bytes"] == fit["capacity_bytes"]
    # one more sample: out of HBM while it ran, or a peak over the capacity
    assert (next_one["error"] or {}).get("type") == "OutOfMemoryError" or (
        next_one["modes"]["strict"]["hbm"]["peak_bytes"] == fit["next_peak_bytes"] > fit["capacity_bytes"])


@pytest.mark.slow   # 3 `tpusim run` processes
def test_a_script_that_fails_at_a_larger_batch_ends_the_run_with_the_error_line_and_its_report(tmp_path):
    script = tmp_path / "wide.py"
    script.write_text(WIDE)
    done = _tpusim("run", str(script), "--chip", "v5e", "--numerics", "off", "--quiet", "--out", str(tmp_path / "r"),
                   "--fit-batch", "batch", "--", "--batch", "8", "--fail-above", "8")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "tpusim run: error: --fit-batch batch: the script failed at --batch 16 (ValueError: this script takes no "
        "batch above 8); no largest batch was found")
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["complete"] and "largest_batch" not in report["modes"]["strict"]
