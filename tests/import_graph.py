"""The project's import graph, read with ``ast`` (no module is imported): which project
modules each module imports. Every ``import`` statement counts, wherever it stands: at
module level, under ``if TYPE_CHECKING:``, or inside a function. An import names the most
specific project module it reaches: ``from worker.engine import grammar`` is an edge to
``worker.engine.grammar``, ``from worker.engine.grammar import Constraint`` too."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gateway", "worker", "planner", "shared", "nightjar", "nj_kernels", "benchmarks", "training")


def modules(root: Path) -> dict[str, tuple[Path, bool]]:
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
    mods = modules(root)
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
