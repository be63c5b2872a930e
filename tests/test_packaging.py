"""What pyproject.toml promises a fresh machine."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_torch_is_pinned_to_the_cpu_build_on_this_machine():
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert "torch==2.13.0" in dependencies
