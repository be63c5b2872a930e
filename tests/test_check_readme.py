"""The manual's CI pages (docs/commands/check.md, docs/ci.md): the `tpusim check` example, the pytest example
file and the GitHub Actions job, run (or parsed) as a user would copy them."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECK_PAGE = (ROOT / "docs" / "commands" / "check.md").read_text()    # tpusim check: the example and its output
CI_PAGE = (ROOT / "docs" / "ci.md").read_text()                         # the Actions job and the pytest plugin

pytest_plugins = ["pytester"]

# pytester points HOME at its temporary folder: without this the tpu shim would compile again there (minutes)
SHIM_CACHE = os.environ.get("TORCH_EXTENSIONS_DIR") or str(Path.home() / ".cache")


@pytest.fixture(autouse=True)
def shared_shim(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", SHIM_CACHE)


def readme_block(name: str) -> str:
    """The fenced block right after ``<!-- name -->`` on one of the CI pages."""
    for page in (CHECK_PAGE, CI_PAGE):
        found = re.search(rf"<!-- {name} -->\n```\w*\n(.*?)```", page, re.S)
        if found:
            return found.group(1)
    raise AssertionError(f"docs/commands/check.md and docs/ci.md have no block marked <!-- {name} -->")


def test_the_actions_job_runs_the_commands_the_readme_documents() -> None:
    """Every `tpusim check` line of the workflow parses with tpusim's own parser; the pytest file it runs is
    the manual's example file."""
    from tpusim.cli.main import build_parser

    workflow = re.search(r"```yaml\n(.*?)```", CI_PAGE, re.S).group(1)
    commands = [line.split("- run:", 1)[1].strip() for line in workflow.splitlines() if "- run:" in line]
    checks = [c for c in commands if "tpusim check" in c]
    assert checks
    for command in checks + [readme_block("check-example").strip()]:
        argv = shlex.split(command)
        args = build_parser().parse_args(argv[argv.index("tpusim") + 1:])
        assert args.command == "check" and args.fail_on == ("float64", "host-sync")
    tested = re.search(r"^# (tests/\S+\.py)", readme_block("pytest-example"), re.M).group(1)
    assert any(tested in c for c in commands)


@pytest.mark.slow      # runs examples/mlp.py under tpusim check: ~20 s on 2 busy cores
def test_the_check_example_fails_the_mlp_as_shown(tmp_path: Path) -> None:
    """The manual shows the gate failing examples/mlp.py on its per-step .item(): exit code 1, those lines."""
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    done = subprocess.run(["bash", "-c", f'export PATH="{Path(sys.executable).parent}:$PATH"\n'
                           + readme_block("check-example")], cwd=tmp_path, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 1, done.stdout + done.stderr
    shown = re.search(r"```text\n(PASS script.*?)```", CHECK_PAGE, re.S).group(1).splitlines()
    got = done.stdout.strip().splitlines()[-len(shown):]
    assert [line.split(":")[0] for line in got] == [line.split(":")[0] for line in shown]
    assert got[-1] == shown[-1] and got[-2] == shown[-2]           # the verdict and the lint finding, verbatim
    suite = ET.parse(tmp_path / "tpusim-junit.xml").getroot().find("testsuite")
    assert (suite.get("tests"), suite.get("failures")) == ("5", "1")


@pytest.mark.slow      # one `tpusim run` subprocess and one tpu test in a fresh pytest
def test_the_pytest_example_passes(pytester: pytest.Pytester) -> None:
    (pytester.path / "examples").symlink_to(ROOT / "examples")
    block = readme_block("pytest-example")
    target = pytester.path / re.search(r"^# (tests/\S+\.py)", block, re.M).group(1)
    target.parent.mkdir()
    target.write_text(block)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", str(target))
    result.assert_outcomes(passed=2)
