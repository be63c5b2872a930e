"""The modules of ``tpusim.backend`` import each other without a cycle.

A cycle hides behind imports written inside functions (they run late, so Python never trips on
it) and makes every module in it depend on every other. The graph here counts every import of a
``tpusim.backend`` module, at module level and inside functions alike, read from the source with
``ast`` (nothing is imported): ``from tpusim.backend import recorder`` is an edge to
``tpusim.backend.recorder`` (a submodule), ``from tpusim.backend.lowering import lookup`` one to
the package ``tpusim.backend.lowering`` (a name it defines), relative imports resolved against
the importing module. Importing a submodule also runs its parent packages' ``__init__``; that
edge is not counted, since every module would then depend on the package that re-exports it.
"""

from __future__ import annotations

import ast
from pathlib import Path

BACKEND = Path(__file__).resolve().parents[2] / "backend"
PACKAGE = "tpusim.backend"


def module_names(root: Path = BACKEND) -> dict[str, Path]:
    """Dotted name -> file of every module under ``root`` (a package is its ``__init__.py``)."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join((PACKAGE, *parts))] = path
    return names


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The ``tpusim.backend`` modules ``name`` imports anywhere in its source."""
    package = name if _is_package(path) else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                found.add(submodule if submodule in modules else source)
    return {m for m in found if m in modules and m != name}


def import_graph(root: Path = BACKEND) -> dict[str, set[str]]:
    modules = module_names(root)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None (depth-first search, white/grey/black)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_finder_sees_a_cycle_and_a_clean_graph() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_relative_and_package_imports_resolve(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "leaf.py").write_text("")
    (tmp_path / "sub" / "__init__.py").write_text("X = 1\n")
    (tmp_path / "sub" / "a.py").write_text("from . import b\nfrom .. import leaf\n\ndef f():\n"
                                           "    from tpusim.backend.sub import X\n")
    (tmp_path / "sub" / "b.py").write_text("import tpusim.backend.leaf\n")
    graph = import_graph(tmp_path)
    assert graph[f"{PACKAGE}.sub.a"] == {f"{PACKAGE}.sub.b", f"{PACKAGE}.leaf", f"{PACKAGE}.sub"}
    assert graph[f"{PACKAGE}.sub.b"] == {f"{PACKAGE}.leaf"}


def test_backend_has_no_import_cycle() -> None:
    graph = import_graph()
    assert len(graph) > 30 and f"{PACKAGE}.fallback" in graph
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle in backend/: " + " -> ".join(cycle)
