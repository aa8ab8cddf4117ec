"""The planner's decision as the engine's ``SpeculationPlan``: the only place the two meet.

The engine (worker/engine/) never sees ``shared.control.Decision``; the worker turns each
decision it applies into a frozen plan (worker/engine/spec/speculation_plan.py) holding just
what the engine reads, and hands that over with ``Engine.apply_plan``.
"""

from __future__ import annotations

from shared.control import Decision
from worker.engine.api import Engine
from worker.engine.spec.speculation_plan import SpeculationPlan


def plan_from(decision: Decision) -> SpeculationPlan:
    """The engine's plan of ``decision``: its containers copied (the step costs themselves
    are shared; nothing changes them)."""
    return SpeculationPlan(
        version=decision.version,
        gamma_table=tuple((int(b), int(g)) for b, g in decision.gamma_table),
        drafter=decision.drafter,
        drafter_scope=decision.drafter_scope,
        request_learner=decision.request_learner,
        request_discount=decision.request_discount,
        drafter_costs=dict(decision.drafter_costs),
        score_drafters=decision.score_drafters,
        skip_drafters=frozenset(decision.skip_drafters),
        offload=decision.offload,
        step_costs=tuple(decision.step_costs),
        acceptance=dict(decision.acceptance),
        acceptance_hi=dict(decision.acceptance_hi),
        hold_steps=decision.hold_steps,
        hold_by_drafter=dict(decision.hold_by_drafter),
        hold_tokens=decision.hold_tokens,
    )


def apply_decision(engine: Engine, decision: Decision) -> None:
    """Have ``engine`` speculate by ``decision`` from its next step on. Thread-safe."""
    engine.apply_plan(plan_from(decision))
