"""The engine's door for the planner: a ``SpeculationPlan``, never the planner's ``Decision``."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from shared.control import ALL_BATCHES
from worker.engine.spec.speculation_plan import SpeculationPlan

ENGINE = Path(__file__).resolve().parents[4] / "worker" / "engine"


def test_no_engine_module_imports_or_names_the_planners_decision() -> None:
    files = sorted(ENGINE.rglob("*.py"))
    assert len(files) > 30 and ENGINE / "engine.py" in files
    named = [str(f.relative_to(ENGINE)) for f in files if re.search(r"Decision", f.read_text())]
    assert named == []
    for f in files:  # nor reaches the worker's side, where decisions are turned into plans
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.ImportFrom):
                assert node.module not in ("worker.decisions", "worker.speculation"), f


def test_the_engine_contract_and_its_plan_stay_torch_free() -> None:
    """The worker imports the contract and builds plans without loading torch."""
    code = "import sys, worker.engine.api, worker.speculation; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ENGINE.parents[1])


def test_the_default_plan_speculates_nothing() -> None:
    plan = SpeculationPlan()
    assert plan.version == 0 and plan.drafter is None and not plan.offload and not plan.step_costs
    assert all(plan.gamma_for(b) == 0 for b in (1, 7, ALL_BATCHES))


def test_gamma_per_batch_bucket() -> None:
    plan = SpeculationPlan(gamma_table=((4, 3), (16, 1), (ALL_BATCHES, 0)))
    assert [plan.gamma_for(b) for b in (1, 4, 5, 16, 17, 1 << 40)] == [3, 3, 1, 1, 0, 0]
    assert SpeculationPlan(gamma_table=((4, 2),)).gamma_for(9) == 2  # the last bucket covers the rest
