"""The manual: the MkDocs site under docs/ builds with --strict (a broken link or anchor, or a page missing from
the nav, fails), every subcommand has a page in the nav, every environment variable is on its page, the output
the collective pages show is what tpusim prints, and README.md (the front page) agrees with the site.

Torch-free: tests/conftest.py groups this file under ``sim``, as every top-level test file not in DEVICE_FILES."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def nav_pages(nav: list) -> list[str]:
    """Every page file mkdocs.yml's nav lists, in order."""
    pages = []
    for entry in nav:
        for value in (entry.values() if isinstance(entry, dict) else [entry]):
            pages += nav_pages(value) if isinstance(value, list) else [value]
    return pages


def mkdocs_nav() -> list[str]:
    return nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])


def test_the_site_builds_with_strict(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(ROOT / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "main_job_report.png").is_file()        # the screenshot is part of the site


def test_every_subcommand_has_a_page_in_the_nav() -> None:
    from tpusim.cli.main import COMMANDS

    listed = mkdocs_nav()
    for command in COMMANDS:
        page = f"commands/{command}.md"
        assert page in listed, f"tpusim {command} has no page in mkdocs.yml's nav (expected docs/{page})"
        assert f"`tpusim {command}`" in (DOCS / page).read_text().splitlines()[0]
    assert len(listed) == len(set(listed))
    assert sorted(listed) == sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))


def test_every_environment_variable_is_on_its_page() -> None:
    from tpusim.envvars import VARIABLES

    page = (DOCS / "environment.md").read_text()
    missing = [v.name for v in VARIABLES if f"`{v.name}`" not in page]
    assert not missing, f"docs/environment.md does not list {missing}"


def shown_commands(page: Path, prefix: str) -> list[tuple[str, list[str]]]:
    """(command, the output lines shown under it) for each ``$ <prefix>...`` line of the page's console blocks."""
    found = []
    for block in re.findall(r"```console\n(.*?)```", page.read_text(), re.S):
        lines = block.splitlines()
        for i, line in enumerate(lines):
            if line.startswith(f"$ {prefix}"):
                output = []
                for after in lines[i + 1:]:
                    if after.startswith("$ "):
                        break
                    output.append(after)
                found.append((line[2:], output))
    return found


@pytest.mark.parametrize("page", ["commands/collective.md", "faults.md"])
def test_the_collective_output_shown_is_what_tpusim_prints(page: str) -> None:
    examples = [(c, out) for c, out in shown_commands(DOCS / page, "python -m tpusim collective") if out]
    assert examples
    for command, shown in examples:
        argv = shlex.split(command)
        done = subprocess.run([sys.executable, *argv[1:]], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        got = done.stdout.rstrip("\n").splitlines()
        if "  ..." in shown:                                 # the page leaves lines out: the first and the last
            cut = shown.index("  ...")
            assert got[:cut] == shown[:cut] and got[-len(shown[cut + 1:]):] == shown[cut + 1:], command
        else:
            assert got == shown, command


def test_the_readme_is_the_front_page_of_the_manual() -> None:
    """README.md keeps the test command .ci/run extracts, shows the same set-up commands as docs/index.md, and
    every relative link in it points at a file that exists."""
    readme = (ROOT / "README.md").read_text()
    test_command = re.search(r"<!-- test-command -->\n```bash\n(.*?)\n```", readme, re.S).group(1)
    assert 'pip install --no-compile -e ".[test' in test_command and "python -m pytest -q" in test_command
    index = (DOCS / "index.md").read_text()
    for command in re.findall(r"```bash\n(python3 -m venv .*?)\n```", readme):
        assert command in index
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    assert links and all((ROOT / link).exists() for link in links if "://" not in link), links
    for page in mkdocs_nav():
        if page.startswith("commands/"):
            assert f"(docs/{page})" in readme, f"README.md's command table does not link docs/{page}"
