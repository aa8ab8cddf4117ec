"""The project's modules import one another without a circle (a lazy or TYPE_CHECKING
import only hides a circle from the interpreter, not from the reader: every import counts,
see ``tests/import_graph.py``), and no test module imports another."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.import_graph import PACKAGES, ROOT, cycles, import_graph


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
