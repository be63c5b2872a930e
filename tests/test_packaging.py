"""pyproject.toml lists every package folder, so a wheel is not missing a subpackage."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_listed():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = set()
    for prefix, folder in config["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / folder).parts
            if "csrc" not in parts:
                found.add(".".join((prefix, *parts)))
    assert found == listed


def test_torch_is_pinned_to_the_cpu_build_on_this_machine():
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert "torch==2.13.0" in dependencies
