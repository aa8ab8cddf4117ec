"""The project's modules import one another without a circle.

Every ``import`` statement counts, wherever it stands: at module level, under
``if TYPE_CHECKING:``, or inside a function (a lazy import only hides a circle from the
interpreter, not from the reader). An import names the most specific project module it
reaches: ``from worker.engine import grammar`` is an edge to ``worker.engine.grammar``,
``from worker.engine.grammar import Constraint`` too.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gateway", "worker", "planner", "shared", "nightjar", "nj_kernels", "benchmarks", "training")


def _modules(root: Path) -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, is a package's __init__)."""
    mods: dict[str, tuple[Path, bool]] = {}
    for pkg in PACKAGES:
        for f in sorted((root / pkg).rglob("*.py")):
            parts = list(f.relative_to(root).with_suffix("").parts)
            is_pkg = parts[-1] == "__init__"
            mods[".".join(parts[:-1] if is_pkg else parts)] = (f, is_pkg)
    return mods


def _resolve(name: str, mods: dict[str, tuple[Path, bool]]) -> str | None:
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the project modules it imports (itself left out)."""
    mods = _modules(root)
    graph: dict[str, set[str]] = {}
    for mod, (path, is_pkg) in mods.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    here = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    here = here[: len(here) - (node.level - 1)]
                    base = ".".join([*here, *([node.module] if node.module else [])])
                targets = [f"{base}.{a.name}" for a in node.names]
            for t in targets:
                r = _resolve(t, mods)
                if r is not None and r != mod:
                    edges.add(r)
        graph[mod] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, list[str]]] = [(start, sorted(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, todo = work[-1]
            if todo:
                w = todo.pop()
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, sorted(graph[w])))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp: list[str] = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_the_detector_finds_a_circle_through_type_checking(tmp_path: Path) -> None:
    pkg = tmp_path / "worker"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from worker.b import B\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n")
    (pkg / "c.py").write_text("def f():\n    from worker import a\n")
    for other in PACKAGES:
        (tmp_path / other).mkdir(exist_ok=True)
    graph = import_graph(tmp_path)
    assert graph["worker.b"] == {"worker.a"} and graph["worker.c"] == {"worker.a"}
    assert cycles(graph) == [["worker.a", "worker.b"]]


def test_no_import_circle_among_the_projects_modules() -> None:
    graph = import_graph()
    assert len(graph) > 100 and "worker.engine.grammar" in graph
    assert cycles(graph) == []


def test_the_finder_sees_every_form_of_a_test_module_import(tmp_path: Path) -> None:
    (tmp_path / "test_a.py").write_text(
        "import os\nfrom tests.x.test_b import C\nfrom . import test_c, prompts\nimport tests.test_d as d\n"
        "def f():\n    from .test_e import g\n"
    )
    assert imported_test_modules(tmp_path / "test_a.py") == ["test_b", "test_c", "test_d", "test_e"]


def imported_test_modules(path: Path) -> list[str]:
    """The ``test_*`` modules a file imports (by their last name), wherever the import stands."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""] + [f"{node.module or ''}.{a.name}" for a in node.names]
        found.update(n.rpartition(".")[2] for n in names if n.rpartition(".")[2].startswith("test_"))
    return sorted(found)


def test_no_test_module_imports_another() -> None:
    """Shared constants, helpers and fixtures live in helper modules or conftest.py files: a
    test module imported by another runs its module code twice under two names and hides
    which tests a change touches."""
    tests = ROOT / "tests"
    offenders = {
        str(f.relative_to(ROOT)): mods
        for f in sorted(tests.rglob("test_*.py"))
        if (mods := imported_test_modules(f))
    }
    assert offenders == {}
