"""tpusim sweep SCRIPT --script-arg: the script recorded once per combination of its swept arguments (batch
size, sequence length), each recording priced over the grid; the rows equal pricing each recording alone,
a bigger batch needs more HBM, and a combination whose recording fails is rows saying so."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pandas as pd
import pytest

from tpusim.cli import main as cli
from tpusim.eager.modes import get_mode
from tpusim.errors import TpusimError
from tpusim.pricing import price
from tpusim.report.steps import split_steps
from tpusim.slice.topology import build_slice
from tpusim.sweep import load_recording
from tpusim.sweep.grid import load_grid_file
from tpusim.sweep.pareto import pareto_flags
from tpusim.sweep.record import run_command
from tpusim.sweep.script_args import combinations, parse_script_arg, script_argv, script_axes, tokens_per_step
from tpusim.sweep.write import sweep_table

SCRIPT = textwrap.dedent('''\
    """A tiny training loop whose activations grow with --batch-size (odd sizes are refused)."""
    import argparse

    import torch

    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--width", type=int, default=256)
    args = parser.parse_args()
    if args.batch_size % 2:
        raise ValueError(f"batch size {args.batch_size} is odd")
    model = torch.nn.Sequential(torch.nn.Linear(args.width, 4 * args.width), torch.nn.GELU(),
                                torch.nn.Linear(4 * args.width, args.width)).to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.randn(args.batch_size, args.width, device="tpu")
    for _ in range(3):
        loss = model(data).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
''')


def test_script_args_parse_expand_and_evaluate_tokens() -> None:
    assert parse_script_arg("batch-size=8, 16,32") == ("batch-size", ("8", "16", "32"))
    assert parse_script_arg("--seq-len=128") == ("seq-len", ("128",))
    for bad, why in (("batch-size", "NAME=VALUE"), ("batch-size=", "NAME=VALUE"), ("b s=1", "letters"),
                     ("chip=v5p", "column of the sweep table")):
        with pytest.raises(TpusimError, match=why):
            parse_script_arg(bad)
    axes = script_axes({"batch-size": [8, 16, 8], "seq-len": ["128", "256"]})
    assert axes == {"batch-size": ("8", "16"), "seq-len": ("128", "256")}
    combos = combinations(axes)
    assert len(combos) == 4 and len(set(combos)) == 4
    assert script_argv(combos[-1]) == ["--batch-size", "16", "--seq-len", "256"]
    assert [tokens_per_step("batch-size*seq-len", c) for c in combos] == [8 * 128, 8 * 256, 16 * 128, 16 * 256]
    assert tokens_per_step("batch-size*1024", combos[0]) == 8192 and tokens_per_step(None, combos[0]) is None
    with pytest.raises(TpusimError, match="'heads' is neither"):
        tokens_per_step("batch-size*heads", combos[0])
    command = run_command(Path("m.py"), combos[0], Path("out"), chip="v5p", topology=None, tokens=1024,
                          fixed_args=["--steps", "2"])
    assert command[command.index("--numerics") + 1] == "off" and "--topology" not in command
    assert command[command.index("--") + 1:] == ["--steps", "2", "--batch-size", "8", "--seq-len", "128"]


def test_grid_file_takes_script_args_and_tokens(tmp_path: Path) -> None:
    (tmp_path / "grid.toml").write_text('chip = ["v5p"]\ntokens_per_step = "batch-size*seq-len"\n'
                                        '[script_args]\nbatch-size = [8, 16]\nseq-len = [128]\n')
    found = load_grid_file(tmp_path / "grid.toml")
    assert found == {"chips": ("v5p",), "tokens_per_step": ("batch-size*seq-len",),
                     "script_args": (("batch-size", [8, 16]), ("seq-len", [128]))}
    assert script_axes(found["script_args"]) == {"batch-size": ("8", "16"), "seq-len": ("128",)}
    (tmp_path / "bad.toml").write_text('script_args = [8, 16]\n')
    with pytest.raises(TpusimError, match="script_args is a table"):
        load_grid_file(tmp_path / "bad.toml")


def test_pareto_is_per_combination_of_script_arguments() -> None:
    """A bigger batch is another workload: each batch size gets its own front of step time vs chips."""
    rows = [{"chip": "v5p", "topology": t, "slices": 1, "mode": "strict", "placement": "default", "batch": b,
             "chips": c, "status": "ok", "step_time_s": s}
            for b, points in ((8, ((4, 2.0), (16, 1.0), (64, 1.5))), (64, ((4, 9.0), (16, 8.0), (64, 3.0))))
            for t, (c, s) in zip(("2d:2x2", "2d:4x4", "3d:4x4x4"), points)]
    rows.append({"chip": "v5p", "topology": "2d:8x8", "slices": 1, "mode": "strict", "placement": "default",
                 "batch": 64, "status": "failed", "error": "recording failed"})
    table = sweep_table(rows, script_columns=("batch",))
    assert list(table.columns[:8]) == ["chip", "calibrated", "topology", "slices", "mode", "placement", "batch",
                                       "chips"]
    for batch, group in table.groupby("batch"):
        ok = group["status"] == "ok"
        expected = pareto_flags([int(c) if k else None for c, k in zip(group["chips"], ok)],
                                [float(s) if k else None for s, k in zip(group["step_time_s"], ok)])
        assert list(group["pareto"]) == expected, batch
    # over the whole table, batch 64's 3.0 s on 64 chips would be beaten by batch 8's 1.0 s on 16
    assert table[(table.batch == 64) & (table.chips == 64)]["pareto"].item()


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None,
                      silence_logs=50) as cluster, Client(cluster) as dask:
        yield dask


@pytest.mark.slow   # three `tpusim run` recordings (a fresh torch process each): ~20 s apiece on 2 busy cores
def test_a_batch_size_sweep_records_each_size_and_prices_it(client, tmp_path: Path, monkeypatch, capsys) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", client.scheduler.address)      # the command uses this cluster
    out = tmp_path / "sweep"
    code = cli.main(["sweep", str(tmp_path / "train.py"), "--script-arg", "batch-size=8,256,3", "--tokens-per-step",
                     "batch-size*1", "--chip", "v5p", "--topology", "2d:2x2,3d:2x2x4", "--quiet", "--out", str(out),
                     "--", "--width", "128"])
    printed = capsys.readouterr()
    assert code == 1, printed.err                                    # batch 3 failed: rows, and exit code 1
    table = pd.read_parquet(out / "sweep.parquet")
    assert len(table) == 3 * 2 and set(table["batch-size"]) == {8, 256, 3}
    failed = table[table["batch-size"] == 3]
    assert (failed.status == "failed").all() and failed.error.str.contains("batch size 3 is odd").all()
    assert "6 points" in printed.out and "4 priced, 0 invalid, 2 failed" in printed.out
    assert "batch-size=256" in printed.out and "batch size 3 is odd" in printed.err
    ok = table[table.status == "ok"]
    assert len(ok) == 4
    for row in ok.to_dict("records"):
        trace = load_recording(row["recording"]).trace
        alone = price(trace, topology=build_slice(row["topology"], chip=row["chip"]), mode=get_mode(row)["mode"])
        assert row["total_s"] == pytest.approx(alone.total_s, rel=1e-12)
        assert row["step_time_s"] == pytest.approx(split_steps(alone).steady_median_s, rel=1e-12)
        assert row["hbm_peak_bytes"] == alone.peak_hbm_bytes
        assert row["tokens_per_s_per_chip"] == pytest.approx(
            row["batch-size"] / row["step_time_s"] / row["chips"], rel=1e-9)
    peak = ok.groupby("batch-size")["hbm_peak_bytes"].max()
    assert peak[256] > peak[8]
    # activations of 248 more rows of width 128 (input) and 512 (hidden), float32, at least once each
    assert peak[256] - peak[8] >= 248 * (128 + 512) * 4
    page = (out / "sweep.html").read_text()
    assert "Step time against batch-size" in page and "HBM peak against batch-size" in page
    assert (out / "recordings" / "batch-size=8" / "report.json").is_file()


def test_bad_script_sweeps_are_clear_errors_before_anything_runs(tmp_path: Path, capsys) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    script = str(tmp_path / "train.py")
    for argv, why in (([script], "needs --script-arg"),
                      ([script, "--script-arg", "batch-size"], "give NAME=VALUE"),
                      ([script, "--script-arg", "batch-size=8", "--tokens-per-step", "batch-size*seq"],
                       "'seq' is neither"),
                      ([script, "--script-arg", "batch-size=8", "--chip", "v5p", "--topology", "2d:2x2",
                        "--mode", "turbo"], "turbo"),
                      ([str(tmp_path / "missing.py"), "--script-arg", "batch-size=8"], "does not exist"),
                      ([str(tmp_path), "--tokens-per-step", "8"], "for a SCRIPT sweep")):
        assert cli.main(["sweep", *argv, "--quiet", "--out", str(tmp_path / "out")]) == 2, argv
        err = capsys.readouterr().err
        assert why in err and "Traceback" not in err, (argv, err)
    assert not (tmp_path / "out" / "recordings").exists()
