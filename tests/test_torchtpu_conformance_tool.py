"""tools/torchtpu_conformance.py: planning, skip rules, output parsing and stand-ins on a tiny fake checkout.

Nothing here imports torch: the runs it makes are plain ``python`` one-liners, so each test is cheap.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parent.parent / "tools" / "torchtpu_conformance.py"


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("torchtpu_conformance", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules["torchtpu_conformance"] = module
    spec.loader.exec_module(module)
    return module


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


MAIN = 'if __name__ == "__main__":\n  main()\n'


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """TorchTPU's layout in miniature: a notebook test, notebooks, a worker with its launchers, a library."""
    return _write(tmp_path / "torch_tpu_checkout", {
        "docs/notebooks/tests/test_cells.py": "def test_ok():\n  assert True\n",
        "docs/notebooks/hello.py": "print('hello from a notebook')\n",
        "docs/notebooks/tpu_utils.py": "def safe_init():\n  pass\n",
        "docs/notebooks/mnist.py": "from sklearn.datasets import fetch_openml\nfetch_openml('mnist_784')\n",
        "examples/distributed/dp/worker.py": "import torch.distributed as dist\n"
                                             "def main():\n  dist.init_process_group('tpu_dist')\n" + MAIN,
        "examples/distributed/dp/launch.sh": "eval $(python3 -m torch_tpu._internal.distributed.launchers"
                                             ".singlehost_wrapper)\npython3 -m torch.distributed.run \\\n"
                                             "    --nproc_per_node=$WORLD_SIZE ./worker.py\n",
        "examples/distributed/dp/launch.py": "from torch.google import distributed as gdist\n"
                                             "from examples.distributed.dp import worker\n"
                                             "def main():\n  gdist.torchrun(worker.main, nproc_per_node=8)()\n"
                                             + MAIN,
        "examples/distributed/dp/model.py": "class Model:\n  pass\n",
        "examples/tutorials/llm.py": "from examples import paths\ndef main():\n  pass\n" + MAIN,
        "examples/tutorials/other.sh": "torchrun --nproc_per_node=8 ./examples/tutorials/gone_test.py\n",
        "torch_tpu/__init__.py": "raise ImportError('TorchTPU itself must never be imported')\n",
    })


def _settings(tool, checkout: Path, tmp_path: Path):
    return tool.Settings(checkout, tool.make_import_root(checkout, tmp_path / "root"), tmp_path / "reports",
                         nproc=4, topology="2d:2x2", skips=True)


def test_plan_covers_each_group_with_its_launchers_and_skip_reasons(tool, checkout, tmp_path):
    s = _settings(tool, checkout, tmp_path)
    tests = tool.plan_tests(s)
    assert [(r.file, r.launcher, r.cwd) for r in tests] == [
        ("docs/notebooks/tests/test_cells.py", "pytest", str(checkout / "docs/notebooks"))]
    assert tests[0].command[-1] == "tests/test_cells.py"

    notebooks = {r.file: r.skip for r in tool.plan_notebooks(s)}
    assert notebooks["docs/notebooks/hello.py"] is None
    assert "helper module" in notebooks["docs/notebooks/tpu_utils.py"]
    assert "OpenML" in notebooks["docs/notebooks/mnist.py"]

    examples = {(r.file, r.launcher): r for r in tool.plan_examples(s)}
    worker = "examples/distributed/dp/worker.py"
    assert {launcher for (f, launcher) in examples if f == worker} == {"python", "torchrun", "tpusim"}
    torchrun = examples[(worker, "torchrun")].command
    assert torchrun[-2:] == ["--nproc_per_node=4", "worker.py"] and "--standalone" in torchrun
    tpusim = examples[(worker, "tpusim")].command
    assert tpusim[2:5] == ["tpusim", "run", "worker.py"]
    assert tpusim[5:11] == ["--ranks", "all", "--topology", "2d:2x2", "--compiler", "model"]
    assert examples[(worker, "python")].skip is None
    assert "torchrun worker run alone" in examples[(worker, "python")].expected_failure
    assert examples[(worker, "tpusim")].expected_failure == ""
    assert "torch.google" in examples[("examples/distributed/dp/launch.py", "python")].skip
    assert examples[("examples/distributed/dp/launch.sh", "bash")].skip is None
    assert "no __main__" in examples[("examples/distributed/dp/model.py", "python")].skip
    assert "examples.paths" in examples[("examples/tutorials/llm.py", "tpusim")].skip
    assert "gone_test.py" in examples[("examples/tutorials/other.sh", "bash")].skip
    assert ("examples/tutorials/llm.py", "torchrun") not in examples       # not a worker


def test_import_root_hides_the_checkouts_torch_tpu(tool, checkout, tmp_path):
    root = tool.make_import_root(checkout, tmp_path / "root")
    assert sorted(p.name for p in root.iterdir()) == ["docs", "examples"]
    env = tool.run_environment(root, None)
    assert env["PYTHONPATH"].split(":")[0] == str(root)


def test_launch_files_name_their_workers(tool, checkout):
    script = checkout / "examples/distributed/dp/launch.sh"
    assert tool.torchrun_targets(checkout, script) == [(checkout / "examples/distributed/dp/worker.py").resolve()]
    launch = (checkout / "examples/distributed/dp/launch.py").read_text()
    assert tool.launched_workers(checkout, launch) == [(checkout / "examples/distributed/dp/worker.py").resolve()]


def test_missing_repo_module_reads_namespace_packages(tool, checkout):
    assert tool.missing_repo_module(checkout, "from examples.distributed.dp import worker\n") is None
    assert tool.missing_repo_module(checkout, "from examples.distributed.dp import gone\n") == \
        "examples.distributed.dp.gone"
    assert tool.missing_repo_module(checkout, "from examples.distributed.dp.worker import main\n") is None
    assert tool.missing_repo_module(checkout, "import torch\nfrom os import path\n") is None


PYTEST_OUTPUT = """\
..EF                                                                     [100%]
==================================== ERRORS ====================================
_______________________ ERROR at setup of test_c ________________________
E       fixture 'device' not found
/x/tests/test_m.py:20: ModuleNotFoundError
=========================== short test summary info ============================
PASSED tests/test_m.py::test_a
PASSED tests/test_m.py::test_b
FAILED tests/test_m.py::test_d - AssertionError: Loss didn't decrease
ERROR tests/test_m.py::test_c - ModuleNotFoundError: No module named 'torch_tpu'
1 failed, 2 passed, 1 error in 3.21s
"""


def test_pytest_summary_counts_and_first_failure(tool):
    counts, results = tool.parse_pytest(PYTEST_OUTPUT)
    assert counts == {"failed": 1, "passed": 2, "errors": 1}
    assert [(r["outcome"], r["test"]) for r in results] == [
        ("passed", "tests/test_m.py::test_a"), ("passed", "tests/test_m.py::test_b"),
        ("failed", "tests/test_m.py::test_d"), ("error", "tests/test_m.py::test_c")]
    assert results[3]["message"] == "ModuleNotFoundError: No module named 'torch_tpu'"
    first, site, _ = tool.first_error(PYTEST_OUTPUT, "pytest")
    assert first.startswith("FAILED tests/test_m.py::test_d - AssertionError")
    assert site == "/x/tests/test_m.py:20"


@pytest.mark.parametrize("prefix", ["", "[rank0]:", "[rank 3] "])
def test_first_error_reads_tracebacks_behind_rank_prefixes(tool, prefix):
    text = "\n".join(prefix + line for line in [
        "starting", "Traceback (most recent call last):", '  File "/w/worker.py", line 7, in <module>',
        "    from torch_tpu import api", "ModuleNotFoundError: No module named 'torch_tpu'"])
    text += "\ntorch.distributed.elastic.multiprocessing.errors.ChildFailedError: later\n"
    first, site, tail = tool.first_error(text, "torchrun")
    assert first == "ModuleNotFoundError: No module named 'torch_tpu'"
    assert site == "/w/worker.py:7"
    assert tail[0] == "Traceback (most recent call last):" and tail[-1] == first


def test_the_error_that_ended_the_run_wins_over_one_it_printed(tool):
    text = ("Traceback (most recent call last):\nValueError: printed by a cell from a subprocess\n"
            "Traceback (most recent call last):\n  File \"/n/nb.py\", line 3, in _\nRuntimeError: the real one\n")
    assert tool.first_error(text, "python")[:2] == ("RuntimeError: the real one", "/n/nb.py:3")
    collection = ("E   ModuleNotFoundError: No module named 'torch_tpu'\n"
                  "ERROR tests/test_d.py\n1 error in 0.5s\n")
    assert tool.first_error(collection, "pytest")[0] == \
        "ERROR tests/test_d.py - ModuleNotFoundError: No module named 'torch_tpu'"


def test_runs_pass_fail_and_time_out_without_hanging(tool, tmp_path):
    env = tool.run_environment(tmp_path, None)
    make = tool.Run

    ok = tool.execute(make("examples", "ok.py", "python", [sys.executable, "-c", "print(1)"], str(tmp_path)),
                      env, 30, tmp_path / "logs")
    assert (ok.outcome, ok.returncode, ok.first_error) == ("pass", 0, "")

    bad = tool.execute(make("examples", "bad.py", "python",
                            [sys.executable, "-c", "import no_such_module_here"], str(tmp_path)),
                       env, 30, tmp_path / "logs")
    assert bad.outcome == "fail" and bad.first_error == "ModuleNotFoundError: No module named 'no_such_module_here'"
    assert Path(bad.log).read_text().startswith("$ (cd ")

    slow = tool.execute(make("examples", "slow.py", "python",
                             [sys.executable, "-c", "import time; time.sleep(60)"], str(tmp_path)),
                        env, 0.5, tmp_path / "logs")
    assert slow.outcome == "fail" and slow.timed_out and slow.seconds < 10
    assert slow.first_error.startswith("timed out after 0.5 s")

    skipped = tool.execute(make("examples", "s.py", "python", [], str(tmp_path), skip="why"), env, 1, tmp_path)
    assert (skipped.outcome, skipped.reason) == ("skip", "why")
    assert any(line.startswith("examples: 4 runs: 1 pass, 2 fail, 1 skip") for line in
               tool.summary_lines([ok, bad, slow, skipped]))

    # A launch script that echoes torchrun's failure and exits 0 failed; its first error is the cause.
    script = ("echo \"python3: Error while finding module specification for 'torch_tpu.x' (ModuleNotFoundError:"
              " No module named 'torch_tpu')\"; echo 'ValueError: then this';"
              " echo 'torch.distributed.elastic.multiprocessing.errors.ChildFailedError: x'; echo done; exit 0")
    shell = tool.execute(make("examples", "launch.sh", "bash", ["bash", "-c", script], str(tmp_path)),
                         env, 30, tmp_path / "logs")
    assert (shell.outcome, shell.returncode) == ("fail", 0)
    assert shell.first_error == "ModuleNotFoundError: No module named 'torch_tpu' (python -m torch_tpu.x)"


def _standin(tool, tmp_path: Path, module: str):
    folder = tmp_path / "standins"
    for name, source in tool.STANDINS[module].items():
        target = folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(source)
    sys.path.insert(0, str(folder))
    try:
        for name in [m for m in sys.modules if m == module or m.startswith(module + ".")]:
            del sys.modules[name]
        return importlib.import_module(module)
    finally:
        sys.path.remove(str(folder))


NOTEBOOK = """\
import marimo
app = marimo.App(width="medium")


@app.cell
def _(a, mo):
  print("b sees", a + 1, Helper.__name__)    # Helper: defined, not returned, by the cell below
  return


@app.cell(hide_code=True)
def _():
  import marimo as mo
  class Helper:
    pass
  a = 41
  try:
    raise RuntimeError("caught")
  except RuntimeError as err:                # Python deletes `err` here; marimo never runs the return
    pass
  return a, err, mo


@app.cell(disabled=True)
def _():
  print("disabled cell ran")


@app.cell
def _(torch, mo):                            # `torch` is no cell's output: marimo ignores it
  mo.output.append(mo.md("markdown shown"))
  raise ValueError("from the notebook")


if __name__ == "__main__":
  app.run()
"""


def test_marimo_standin_runs_a_notebook_as_marimo_does(tool, tmp_path):
    folder = tmp_path / "standins"
    for name, source in tool.STANDINS["marimo"].items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(source)
    (tmp_path / "nb.py").write_text(NOTEBOOK)
    env = {**tool.run_environment(tmp_path, folder), "PYTHONPATH": str(folder)}
    done = subprocess.run([sys.executable, "nb.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.splitlines() == ["b sees 42 Helper", "markdown shown"]
    assert done.returncode == 1
    assert tool.first_error(done.stderr, "python")[:2] == ("ValueError: from the notebook", f"{tmp_path}/nb.py:32")


def test_absl_flags_standin_parses_bools(tool, tmp_path):
    _standin(tool, tmp_path, "absl")
    from absl import flags
    flags.DEFINE_bool("static_graph", False, "help")
    flags.DEFINE_bool("init_sync", True, "help")
    assert flags.FLAGS(["prog", "--static_graph", "--noinit_sync", "rest"]) == ["prog", "rest"]
    assert (flags.FLAGS.static_graph, flags.FLAGS.init_sync) == (True, False)
    for name in [m for m in sys.modules if m == "absl" or m.startswith("absl.")]:
        del sys.modules[name]


def test_help_teaches_usage(tool, capsys):
    with pytest.raises(SystemExit):
        tool.parse_args(["--help"])
    text = capsys.readouterr().out
    assert "--checkout" in text and "--json" in text and "Example:" in text


def test_not_a_checkout_is_one_clear_line(tool, tmp_path, capsys):
    assert tool.main(["--checkout", str(tmp_path), "--list"]) == 2
    assert "neither docs/notebooks nor examples/" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("TORCHTPU_CHECKOUT"),
                    reason="set TORCHTPU_CHECKOUT to a checkout of google-pytorch/torch_tpu (not redistributable here)")
def test_torchtpus_own_notebook_tests_pass_but_the_documented_departure(tmp_path):
    """TorchTPU's docs/notebooks/tests run unchanged; the one expected failure is its error glossary's
    inference_mode crash, which tpusim runs (and lints as compile-inference-mode) instead of crashing."""
    report = tmp_path / "conformance.json"
    subprocess.run([sys.executable, str(TOOL), "--checkout", os.environ["TORCHTPU_CHECKOUT"], "--group", "tests",
                    "--json", str(report), "--log-dir", str(tmp_path / "logs")], check=True, timeout=3600)
    failed = [t["test"] for r in json.loads(report.read_text())["results"] for t in r.get("test_results", [])
              if t["outcome"] != "passed"]
    assert failed == ["tests/test_error_glossary.py::test_inference_mode_crash"], failed
