"""The layers of DESIGN.md hold: the contracts in pyproject.toml ([tool.importlinter]) pass, and no module
imports itself back through others (imports inside functions count: grimp reads every import in the source)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.sim


def test_the_import_contracts_hold():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    done = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def module_cycles(graph: grimp.ImportGraph) -> list[tuple[str, ...]]:
    """Every import a -> b where b leads back to a, as the shortest loop through it."""
    loops = set()
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            back = graph.find_shortest_chain(importer=imported, imported=module)
            if back:
                loops.add((module, *back))
    return sorted(loops)


def test_the_cycle_finder_sees_a_loop(tmp_path, monkeypatch):
    package = tmp_path / "loopy"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from loopy import b\n")
    (package / "b.py").write_text("from loopy import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert module_cycles(grimp.build_graph("loopy", cache_dir=None)) == [("loopy.a", "loopy.b", "loopy.a"),
                                                                        ("loopy.b", "loopy.a", "loopy.b")]


def test_no_module_of_tpusim_is_in_an_import_loop():
    assert module_cycles(grimp.build_graph("tpusim", cache_dir=None)) == []
