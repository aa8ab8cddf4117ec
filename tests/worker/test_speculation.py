"""The worker turns each planner decision into the engine's ``SpeculationPlan``."""

from __future__ import annotations

import dataclasses

from shared.control import ALL_BATCHES, Decision, StepCosts
from worker.engine.spec.plan import CostRule
from worker.engine.spec.speculation_plan import SpeculationPlan
from worker.speculation import apply_decision, plan_from


def _decision() -> Decision:
    return Decision(
        version=7,
        policy="t",
        gamma_table=[(4, 3), (ALL_BATCHES, 1)],
        drafter="ngram",
        drafter_scope="request",
        request_learner="hedge",
        request_discount=0.9,
        score_drafters=False,
        drafter_costs={"ngram": 0.1},
        skip_drafters=["copy"],
        offload=True,
        step_costs=[StepCosts(batch=1, plain_s=0.01, spec_s={"ngram": [0.012, 0.014]})],
        acceptance={"ngram": 0.4},
        acceptance_hi={"ngram": 0.7},
        hold_steps=3,
    )


def test_every_field_of_the_plan_is_the_decisions() -> None:
    d = _decision()
    plan = plan_from(d)
    for f in dataclasses.fields(SpeculationPlan):
        mine, theirs = getattr(plan, f.name), getattr(d, f.name)
        if isinstance(mine, tuple):
            mine, theirs = list(mine), [tuple(x) if isinstance(x, tuple) else x for x in theirs]
        elif isinstance(mine, frozenset):
            theirs = frozenset(theirs)
        assert mine == theirs, f.name
    assert [plan.gamma_for(b) for b in (1, 4, 5, 100)] == [d.gamma_for(b) for b in (1, 4, 5, 100)]


def test_the_plan_shares_no_container_with_the_decision() -> None:
    d = _decision()
    plan = plan_from(d)
    d.acceptance["ngram"] = 0.9
    d.skip_drafters.append("ngram")
    assert plan.acceptance["ngram"] == 0.4 and "ngram" not in plan.skip_drafters


def test_the_cost_rule_is_built_from_the_plan() -> None:
    rule = CostRule(plan_from(_decision()))
    assert rule.drafters == ["ngram"] and rule.gamma_max == 2 and rule.hold == 3
    assert rule.prior == {"ngram": 0.4} and rule.hi == {"ngram": 0.7}


def test_apply_decision_hands_the_engine_its_plan() -> None:
    got: list[SpeculationPlan] = []

    class Door:
        def apply_plan(self, plan: SpeculationPlan) -> None:
            got.append(plan)

    apply_decision(Door(), _decision())  # type: ignore[arg-type]
    assert got == [plan_from(_decision())]
