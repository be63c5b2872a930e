"""The device side of issue 17: ops making complex results from real inputs meet TPUSIM_F64 at that op,
linalg.eig is priced by its closed form, and a host allocation that fails is in no HBM counter. Each case
runs in a fresh process with its own environment, as a user's script would."""

from __future__ import annotations

import json
import os
import subprocess
import sys

PROBE = """
import json, warnings, torch, tpusim.backend as tb
a = torch.randn(8, 8, device="tpu")
out = {}
with tb.recording() as rec:
    for name, f in (("eig", lambda: torch.linalg.eig(a)), ("fft", lambda: torch.fft.fft(a)),  # line 6
                    ("eigvals", lambda: torch.linalg.eigvals(a))):                             # line 7
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            try:
                f()
                out[name] = "ran"
            except RuntimeError as e:
                out[name] = str(e)
        out[name + "_warned"] = [str(w.message) for w in seen if type(w.message).__name__ == "TpuFloat64Warning"]
out["records"] = [[r.op, r.flops] for r in rec.trace.records if type(r).__name__ == "OpRecord"]
print("RESULT " + json.dumps(out))
"""


def probe(code: str, **env: str) -> dict:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                            env={**os.environ, **env})
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.split("RESULT ", 1)[1])


def test_f64_error_stops_real_to_complex_ops_at_the_op():
    out = probe(PROBE, TPUSIM_F64="error")
    for name, op, line in (("eig", "aten::linalg_eig", 6), ("fft", "aten::_fft_r2c", 6),
                           ("eigvals", "aten::_linalg_eigvals", 7)):
        assert out[name].startswith(f"tpusim: {op} making complex results at <string>:{line}: TPUs have no "
                                    f"native float64/complex arithmetic"), out[name]
    assert out["records"] == []                     # stopped before running: nothing recorded


def test_f64_warn_names_real_to_complex_ops_and_eig_costs_its_closed_form():
    out = probe(PROBE, TPUSIM_F64="warn")
    assert out["eig"] == out["fft"] == "ran"
    assert out["eig_warned"] and "aten::linalg_eig ran in complex" in out["eig_warned"][0]
    assert out["fft_warned"] and "aten::_fft_r2c" in out["fft_warned"][0]
    flops = dict(map(tuple, out["records"]))
    n = 8                                          # Golub & Van Loan 7.5.6: 25 n^3 (Schur vectors), 10 n^3 (values)
    assert flops["aten::linalg_eig"] == 25 * n ** 3 and flops["aten::_linalg_eigvals"] == 10 * n ** 3


def test_batched_eig_is_priced_per_matrix():
    out = probe("import json, torch, tpusim.backend as tb\n"
                "a = torch.randn(3, 16, 16, device='tpu')\n"
                "with tb.recording() as rec:\n    torch.linalg.eig(a)\n"
                "print('RESULT ' + json.dumps([r.flops for r in rec.trace.records if type(r).__name__ == 'OpRecord']))",
                TPUSIM_F64="allow")
    assert out == [3 * 25 * 16 ** 3]


def test_a_failed_host_allocation_is_not_in_the_hbm_peak():
    out = probe("import json, torch, tpusim.backend as tb\n"
                "keep = torch.ones(1000, device='tpu')\n"
                "before = torch.tpu.max_memory_allocated()\n"
                "with tb.recording() as rec:\n"
                "    try:\n        torch.empty(2 ** 48, dtype=torch.uint8, device='tpu')\n"
                "    except torch.OutOfMemoryError as e:\n        err = str(e)\n"
                "mem = [r.bytes for r in rec.trace.records if type(r).__name__ == 'MemoryRecord']\n"
                "print('RESULT ' + json.dumps([before, torch.tpu.max_memory_allocated(), "
                "torch.tpu.memory_allocated(), mem, err]))",
                TPUSIM_HBM_BYTES="0")      # unlimited HBM: only the host (256 TiB > its address space) can refuse
    before, peak, allocated, mem, err = out
    assert "the host is out of memory allocating" in err, err
    assert peak == before == allocated == 4000 and mem == []
