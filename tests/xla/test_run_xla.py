"""`tpusim run --compiler xla` end to end on a torch.compile'd training loop (the xla extra; skipped without it):
report.json's per-mode ``xla`` equals what the compiled executables say, compiled again here from the
recorded StableHLO; ``--compiler model`` leaves the programs to tpusim's model and says so."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tpusim.cli.compare import reprice
from tpusim.eager.fusion import FusedKernel
from tpusim.hardware.calibration import calibrated
from tpusim.hardware.compute import kernel_cost
from tpusim.hardware.spec import load_chip
from tpusim.report.load import load_report
from tpusim.trace.records import OpRecord, read_trace, record_signature
from tpusim.xla.compiler import compile_stablehlo, missing, target_for
from tpusim.xla.hlo import parse_program
from tpusim.xla.kernels import program_kernels, program_records

pytestmark = [pytest.mark.xla, pytest.mark.skipif(missing() is not None, reason=str(missing()))]
ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import torch
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256)).to("tpu")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
step = torch.compile(model)
for _ in range(3):
    step(torch.randn(64, 256, device="tpu")).sum().backward()
    opt.step()
    opt.zero_grad()
"""


def run(tmp_path: Path, *flags: str) -> tuple[subprocess.CompletedProcess, dict]:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "tpusim", "run", str(script), "--chip", "v5e", "--out", str(out),
                           *flags], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return done, json.loads((out / "report.json").read_text())


def test_the_report_gives_xlas_estimate_of_each_compiled_graph(tmp_path):
    done, report = run(tmp_path, "--compiler", "xla")
    mode = report["modes"]["strict"]
    assert mode["compiler"] == "xla" and mode["xla"]["fell_back"] == []
    modules = read_trace(tmp_path / "out" / "program.jsonl").meta.xla_modules
    assert [m.label for m in modules] == ["graph 0 (forward)", "graph 1 (backward)"]
    target = target_for(load_chip("v5e"))
    compiled = [compile_stablehlo(m.stablehlo, target) for m in modules]
    programs = [parse_program(c.hlo) for c in compiled]
    runs = [len(m.programs) for m in modules]
    assert runs == [3, 3]
    assert mode["xla"]["programs"] == 2 and mode["xla"]["executions"] == 6
    assert mode["xla"]["fusions"] == sum(len(p.fusions) for p in programs)
    assert mode["xla"]["kernels"] == sum(p.kernels * n for p, n in zip(programs, runs))
    assert mode["xla"]["hbm_peak_bytes"] == max(c.memory["peak_memory_in_bytes"] for c in compiled)
    expected = sum(p.estimated_cycles * n for p, n in zip(programs, runs)) / target.clock_hz
    assert mode["xla"]["estimated_s"] == pytest.approx(expected, rel=1e-8)
    # the step prices XLA's kernels: each one the chip's model of it, as many times as the programs ran
    chip = calibrated(load_chip("v5e"))          # tpusim run prices the calibrated chip by default
    priced = sum(kernel_cost(k, chip).seconds * n for p, n in zip(programs, runs) for k in program_kernels(p))
    assert mode["xla"]["priced_s"] == pytest.approx(priced, rel=1e-6)
    assert 0 < mode["xla"]["model_s"] < mode["total_s"] and mode["xla"]["priced_s"] < mode["total_s"]
    trace = json.loads((tmp_path / "out" / "trace.json").read_text())
    names = {e.get("name", "") for e in trace["traceEvents"]}
    assert all(f"xla:{f.name}[{f.kind}]" in names for p in programs for f in p.fusions)   # Perfetto shows them
    assert "TPU compiler (XLA): 2 compiled graphs, 6 executions" in done.stdout
    assert "TPU compiler (strict)" in (tmp_path / "out" / "report.html").read_text()
    assert "libtpu" not in done.stderr and "TPU_" not in done.stderr     # nothing of libtpu's start-up noise


@pytest.mark.slow      # about 37 s: two end-to-end runs
def test_compiler_model_leaves_the_programs_to_the_model_and_says_so(tmp_path):
    done, report = run(tmp_path, "--compiler", "model")
    mode = report["modes"]["strict"]
    assert mode["compiler"] == "model" and "priced_s" not in mode["xla"]
    assert mode["xla"]["fell_back"] == ["graph 0 (forward): --compiler model", "graph 1 (backward): --compiler model"]
    assert "TPU compiler: not used (--compiler model)" in done.stdout


EAGER = """
import torch
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256)).to("tpu")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    model(torch.randn(64, 256, device="tpu")).sum().backward()
    opt.step()
    opt.zero_grad()
"""


def test_eager_ops_and_fused_clusters_run_as_xlas_kernels(tmp_path):
    script = tmp_path / "eager.py"
    script.write_text(EAGER)
    out = tmp_path / "eager"
    done = subprocess.run([sys.executable, "-m", "tpusim", "run", str(script), "--chip", "v5e", "--mode", "all",
                           "--compiler", "xla", "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    modes = json.loads((out / "report.json").read_text())["modes"]
    trace = read_trace(out / "program.jsonl")
    lowered = [m for m in trace.meta.xla_ops if m.stablehlo]
    target, chip = target_for(load_chip("v5e")), calibrated(load_chip("v5e"))
    built = {m.label: program_records(parse_program(compile_stablehlo(m.stablehlo, target).hlo)) for m in lowered}
    eager_ops = [r for r in trace.records if isinstance(r, OpRecord) and record_signature(r) in built
                 and any(isinstance(k, FusedKernel) for k in built[record_signature(r)].records)]
    for name in ("strict", "debug"):
        ops = modes[name]["xla"]["ops"]
        assert ops["compiled"] == len(lowered) and ops["calls"] == len(eager_ops) > 0
        if name == "strict":      # each call: its kernels, each the chip's model of it
            expected = sum(kernel_cost(k, chip).seconds for op in eager_ops
                           for k in built[record_signature(op)].records if isinstance(k, FusedKernel))
            assert ops["priced_s"] == pytest.approx(expected, rel=1e-6)
    fused = modes["fused"]["xla"]["ops"]          # Fused: each cluster one program, composed from its ops'
    assert fused["clusters"] > 0 and fused["calls"] > 0 and fused["priced_s"] > 0
    assert "TPU compiler (XLA), strict:" in done.stdout and "TPU compiler (XLA), fused:" in done.stdout
    # tpusim compare re-prices the same recording on another chip through the compiler, compiled for that chip
    report, folder = load_report(out)
    again = reprice(folder, report, "2d:1x1", "v6e", "strict", compiler="xla").modes["strict"]
    assert again.compiler == "xla" and again.xla.ops.calls == modes["strict"]["xla"]["ops"]["calls"]
    assert reprice(folder, report, "2d:1x1", "v6e", "strict", compiler="model").modes["strict"].xla is None
