"""The pytest plugin (tpusim/testing/plugin.py) as a CI user meets it: a sample user project run by pytest in
a fresh process (pytester), with the plugin loaded from its ``pytest11`` entry point, one test within its
budget, one over it, one lint failure, and ``tpu``-marked tests checked against CPU results."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from factories import TRAINING_SCRIPT

pytest_plugins = ["pytester"]

# pytester points HOME at its temporary folder: without this the tpu shim would compile again there (minutes)
SHIM_CACHE = os.environ.get("TORCH_EXTENSIONS_DIR") or str(Path.home() / ".cache")


@pytest.fixture(autouse=True)
def shared_shim(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", SHIM_CACHE)


TRAIN_F64 = '''
import torch
w = torch.randn(64, 64, device="tpu", requires_grad=True)
opt = torch.optim.SGD([w], lr=0.1)
for step in range(3):
    (w.double() @ w.double()).sum().backward()
    opt.step()
    opt.zero_grad()
'''

USER_TESTS = '''
import pytest
import torch


def test_step_time_within_budget(tpusim_run):
    run = tpusim_run("train.py", topology="2d:2x2", chip="v5e")
    assert run.report.run.chip == "v5e" and run.report.slice.chips == 4
    run.assert_budgets(max_step_time="1s", max_hbm=0.5, fail_on="f64,host-sync")
    assert 0 < run.step_time_s < 1 and run.hbm_peak_bytes >= 64 * 128 * 4


def test_step_time_over_budget(tpusim_run):
    tpusim_run("train.py").assert_budgets(max_step_time="1ns")


def test_no_float64(tpusim_run):
    run = tpusim_run("train_f64.py")
    assert not run.lint("f64"), run.lint("f64")[0].message


@pytest.mark.tpu(mode="fused")
def test_matmul_matches_cpu(tpu):
    assert tpu.mode == "fused" and tpu.device.type == "tpu"
    x = torch.randn(16, 32)
    out = tpu.assert_cpu_equal(lambda a: torch.nn.functional.gelu(a @ a.T).sum(dim=1), x)
    assert out.device.type == "tpu"


@pytest.mark.tpu
def test_a_wrong_kernel_is_caught(tpu):
    tpu.assert_cpu_equal(lambda a: a + 1 if a.device.type == "cpu" else a + 1.5, torch.ones(3))
'''


@pytest.fixture
def user_project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(train=TRAINING_SCRIPT, train_f64=TRAIN_F64, test_model=USER_TESTS)
    return pytester


@pytest.mark.slow      # five tests, three `tpusim run`s in fresh processes: ~1 min on 2 busy cores
def test_a_user_project_under_the_plugin(user_project: pytest.Pytester) -> None:
    result = user_project.runpytest_subprocess("-p", "no:cacheprovider", "-rA")
    result.assert_outcomes(passed=2, failed=3)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([
        "PASSED test_model.py::test_step_time_within_budget",
        "PASSED test_model.py::test_matmul_matches_cpu",
        "FAILED test_model.py::test_step_time_over_budget*",
        "FAILED test_model.py::test_no_float64*",
        "FAILED test_model.py::test_a_wrong_kernel_is_caught*",
    ])
    output = result.stdout.str()
    assert re.search(r"^E +AssertionError: tpusim budget failed:\n"
                     r"E +step-time\[strict\]: step time [0-9.]+ us > budget 1 ns \(strict mode on 3d:1x1x1 v5p\)$",
                     output, re.M)
    assert re.search(r"^E +AssertionError: aten::\S+ uses float64/complex", output, re.M)
    assert "E       AssertionError: tpu (v5p, strict mode) differs from CPU: Tensor-likes are not close!" in output
    assert "RunReport(report=" not in output and "def assert_budgets" not in output   # the helpers' frames hidden


def test_the_marker_is_registered_without_importing_torch(pytester: pytest.Pytester) -> None:
    """The entry point loads in every pytest run: it must declare the marker and cost no torch import."""
    pytester.makepyfile(test_nothing='''
import sys
def test_plugin_loaded(request):
    assert request.config.pluginmanager.has_plugin("tpusim")
    assert "torch" not in sys.modules
''')
    result = pytester.runpytest_subprocess("--markers", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["@pytest.mark.tpu(chip=None, topology=None, mode=None, numerics='on'):*"])
    assert pytester.runpytest_subprocess("-p", "no:cacheprovider").ret == pytest.ExitCode.OK


@pytest.mark.slow      # a fresh pytest that imports torch and the tpu device: ~10-20 s on 2 busy cores
def test_bad_marker_options_fail_with_their_name(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_bad='''
import pytest
@pytest.mark.tpu(chips="v5e")
def test_typo(tpu):
    pass
@pytest.mark.tpu(chip="v99")
def test_unknown_chip(tpu):
    pass
''')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(["*unknown option(s) chips; accepted: chip, topology, mode, numerics*",
                                 "*@pytest.mark.tpu(chip='v99'): *v99*"])


@pytest.mark.slow      # a fresh pytest that imports torch and the tpu device: ~10-20 s on 2 busy cores
def test_tests_of_different_chips_share_one_pytest_process(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_chips='''
import pytest, torch
KEEP = []
@pytest.mark.tpu(chip="v5e", topology="2d:2x2")
def test_v5e(tpu):
    assert torch.tpu.get_device_name() == "TPU v5e" and tpu.topology == (2, 2)
    tpu.assert_cpu_equal(lambda a: a * 2, torch.ones(3))
@pytest.mark.tpu(chip="v5p", topology="3d:2x2x2", numerics="off")
def test_v5p_shape_only(tpu):
    assert torch.tpu.get_device_name() == "TPU v5p" and tpu.topology == (2, 2, 2) and not tpu.numerics
@pytest.mark.tpu(chip="v6e")
def test_keeps_a_tensor(tpu):
    KEEP.append(torch.ones(2, device="tpu"))
@pytest.mark.tpu(chip="v5e")
def test_after_a_kept_tensor(tpu):
    pass
''')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA")
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines(["*(v6e, numerics on) is still alive (a module-level variable or a session fixture "
                                 "holds it)*", "ERROR test_chips.py::test_after_a_kept_tensor*"])
