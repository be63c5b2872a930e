"""Eager ops recorded for the TPU compiler (tpusim/backend/program_trace/op_programs.py, TPUSIM_XLA_OPS=1): every
op of the recording is one of the kept signatures, each lowered to StableHLO that computes what the op computes, and
keeping them never keeps a tensor alive (the recording's frees are the same as without)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SCRIPT = r"""
import json, sys
import torch
import tpusim.backend as backend
from tpusim.trace.records import OpRecord, MemoryRecord, record_signature

model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 32)).to("tpu")
with backend.recording() as rec:
    for _ in range(2):
        model(torch.randn(16, 64, device="tpu")).sum().backward()
trace = rec.trace
ops = {m.label: m for m in trace.meta.xla_ops or ()}
calls = [record_signature(r) for r in trace.records if isinstance(r, OpRecord)]
json.dump({"signatures": sorted(ops), "records": calls,
           "frees": sum(1 for r in trace.records if isinstance(r, MemoryRecord) and r.event == "free"),
           "text": {k: m.stablehlo for k, m in ops.items()}, "errors": {k: m.error for k, m in ops.items()}},
          open(sys.argv[1], "w"))
"""


def record(tmp_path, xla_ops: bool) -> dict:
    out = tmp_path / f"ops_{xla_ops}.json"
    env = {**os.environ, "TPUSIM_XLA_OPS": "1" if xla_ops else "0"}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(out)], capture_output=True, text=True, timeout=600,
                          env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


def test_every_eager_op_has_its_signature_lowered_and_nothing_is_kept_alive(tmp_path):
    on, off = record(tmp_path, True), record(tmp_path, False)
    assert off["signatures"] == [] and on["records"] == off["records"]
    assert on["frees"] == off["frees"] > 0                     # the kept calls hold no tensor
    assert set(on["records"]) == set(on["signatures"])          # each op call is one of the kept signatures
    addmm = next(k for k in on["signatures"] if k.startswith("aten::addmm|") and "[16,64]" in k)
    assert "stablehlo.dot_general" in on["text"][addmm] and on["errors"][addmm] == ""
    gelu = next(k for k in on["signatures"] if k.startswith("aten::gelu|"))
    assert "tanh" in on["text"][gelu] or "erf" in on["text"][gelu]
    lowered = [k for k, text in on["text"].items() if text]
    assert len(lowered) >= len(on["signatures"]) - 2             # the random init alone may lack a lowering


CONFIGURED = r"""
import json, os, sys
import torch
import tpusim.backend as backend
os.environ.pop("TPUSIM_XLA_OPS", None)
backend.configure(backend.load_config(op_programs=sys.argv[2] == "1"))
with backend.recording() as rec:
    torch.nn.Linear(8, 4).to("tpu")(torch.randn(2, 8, device="tpu")).sum()
json.dump(len(rec.trace.meta.xla_ops or ()), open(sys.argv[1], "w"))
"""


@pytest.mark.slow
def test_the_device_config_not_the_environment_says_whether_op_programs_are_kept(tmp_path):
    """``DeviceConfig.op_programs`` (what `tpusim run` sets from --compiler) decides it; the variable is unset."""
    kept = {}
    for on in ("1", "0"):
        out = tmp_path / f"kept_{on}.json"
        env = {k: v for k, v in os.environ.items() if k != "TPUSIM_XLA_OPS"}
        done = subprocess.run([sys.executable, "-c", CONFIGURED, str(out), on], capture_output=True, text=True,
                              timeout=600, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        kept[on] = json.loads(out.read_text())
    assert kept["1"] > 0 and kept["0"] == 0
