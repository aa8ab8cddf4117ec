"""The runtime dependencies serve; training's extra packages are not needed to serve.

``pip install -e .`` installs ``[project].dependencies``: whatever a service imports (at any
depth, lazily too: ``nightjar up`` exports SmolLM2 through ``training.smollm2``) must be one of
them, a package one of them brings (``ALSO_PULLED``), the standard library or the project.
``.[train]`` adds what the training pipelines need on top; ``.[dev]`` includes it, so
``make install`` and CI keep everything.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from typing import Any

from tests.import_graph import PACKAGES, ROOT, import_graph, modules

SERVING = ("gateway", "worker", "planner", "shared", "nightjar", "nj_kernels")
ALSO_PULLED = {"starlette": "fastapi", "pydantic-core": "pydantic"}  # imported, brought by
TRAIN_ONLY = {"tqdm"}  # training/eagle.py and eagle_data.py: progress bars


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].strip().lower().replace("_", "-")


def _project() -> dict[str, Any]:
    project: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project


def serving_modules() -> set[str]:
    """The services' modules and every project module they import, at any depth."""
    graph = import_graph()
    todo = [m for m in graph if m.split(".")[0] in SERVING]
    seen = set(todo)
    while todo:
        for n in graph[todo.pop()]:
            if n not in seen:
                seen.add(n)
                todo.append(n)
    return seen


def third_party_imports(module_names: set[str]) -> dict[str, set[str]]:
    """Distribution -> the modules importing it (every import statement, lazy ones too)."""
    dists = importlib.metadata.packages_distributions()
    files = modules(ROOT)
    found: dict[str, set[str]] = {}
    for mod in module_names:
        path = files[mod][0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top in PACKAGES:
                    continue
                for dist in dists.get(top, [top]):
                    found.setdefault(_name(dist), set()).add(mod)
    return found


def test_what_serving_imports_is_a_runtime_dependency() -> None:
    runtime = {_name(r) for r in _project()["dependencies"]}
    imported = third_party_imports(serving_modules())
    assert "training.smollm2" in serving_modules()  # nightjar up's default model export
    missing = {d: sorted(mods)[:3] for d, mods in imported.items() if d not in runtime | set(ALSO_PULLED)}
    assert missing == {}
    assert set(ALSO_PULLED.values()) <= runtime


def test_training_extras_stay_out_of_the_runtime_and_dev_has_them() -> None:
    project = _project()
    runtime = {_name(r) for r in project["dependencies"]}
    extras = project["optional-dependencies"]
    train = {_name(r) for r in extras["train"]}
    assert train >= TRAIN_ONLY and not train & runtime
    assert "nightjar[train]" in extras["dev"]
    training = {m for m in import_graph() if m.startswith("training.")}
    assert set(third_party_imports(training)) >= TRAIN_ONLY  # what the extra is for
    assert not TRAIN_ONLY & set(third_party_imports(serving_modules()))
