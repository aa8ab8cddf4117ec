"""hedge: finds the best of five drafters, follows a shift of domain, delayed feedback."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import pytest

from planner.policies import registry
from planner.policies.hedge import HedgePolicy
from shared.control import Telemetry
from shared.experts import ExpertLearner, _normalhedge_weights
from tests.planner.scenarios import drafter_shift, run


def _drafters(decisions: Sequence[tuple[object, str | None, bool]]) -> list[str | None]:
    return [d[1] for d in decisions]


def _first(drafters: list[str | None], name: str, start: int = 0) -> int:
    return next(i for i in range(start, len(drafters)) if drafters[i] == name)


def test_finds_best_of_five_and_follows_a_shift() -> None:
    for learner in ("normalhedge", "hedge"):
        _, trace = run("hedge", drafter_shift(600), 1200, seed=0, learner=learner)
        ds = _drafters(trace.decisions)
        found = _first(ds, "d2")
        assert found < 50, (learner, found)
        assert ds[found:600].count("d2") == 600 - found  # and keeps it until the shift
        switched = _first(ds, "d3", 600) - 600
        print(f"{learner}: best drafter after {found} rounds, followed the shift in {switched}")
        assert switched < 100, (learner, switched)
        assert ds[700:].count("d3") == 500


def test_without_forgetting_the_shift_takes_far_longer() -> None:
    _, trace = run("hedge", drafter_shift(600), 1200, seed=0, discount=1.0)
    ds = _drafters(trace.decisions)
    assert ds[600:800].count("d3") == 0  # the stationary learner is still on d2


def _cf(step: int, ts: float, rates: dict[str, float]) -> Telemetry:
    return Telemetry(worker_id="w", step=step, ts=ts, batch_size=2, num_tokens=4, gamma=1,
                     step_time=0.01, counterfactual=rates)  # fmt: skip


def test_delayed_feedback_is_applied_in_order() -> None:
    """Rounds arriving out of order give the same learner state as in order."""
    rounds = [_cf(i, float(i), {"a": 0.9 if i < 5 else 0.1, "b": 0.5}) for i in range(10)]
    in_order = registry.create("hedge")
    shuffled = registry.create("hedge")
    assert isinstance(in_order, HedgePolicy) and isinstance(shuffled, HedgePolicy)
    for t in rounds:
        in_order.observe(t)
    for t in reversed(rounds):
        shuffled.observe(t)
    assert in_order.decide(0.0).extra == shuffled.decide(0.0).extra
    assert in_order.chooser.rounds == 10


def test_heartbeats_and_reports_without_counterfactuals_are_ignored() -> None:
    pol = registry.create("hedge")
    assert isinstance(pol, HedgePolicy)
    pol.observe(Telemetry(worker_id="w", batch_size=0, counterfactual={"a": 1.0}))
    pol.observe(_cf(1, 1.0, {}))
    assert pol.decide(0.0).drafter is None and pol.chooser.rounds == 0


def test_restricted_to_listed_drafters() -> None:
    pol = registry.create("hedge", drafters="a,b")
    for i in range(20):
        pol.observe(_cf(i, float(i), {"a": 0.5, "b": 0.6, "c": 0.99}))
    assert pol.decide(0.0).drafter == "b"


def test_gamma_rule_follows_acceptance() -> None:
    pol = registry.create("hedge", gamma_rule="acceptance", gamma_threshold=0.4, gamma_max=6)
    for i in range(60):
        pol.observe(_cf(i, float(i), {"good": 0.9, "bad": 0.3}))
    choice = pol.decide(0.0)
    assert choice.drafter == "good"
    assert choice.gamma_table[-1][1] == 6  # 0.9^6 = 0.53 ≥ 0.4 (0.9^8 = 0.43 also, capped)
    assert registry.create("hedge", gamma=2).decide(0.0).gamma_table[-1][1] == 2


def test_normalhedge_weights() -> None:
    learner = ExpertLearner("normalhedge", discount=1.0)
    learner.update({"a": 0.5, "b": 0.5})
    assert learner.weights() == {"a": 0.5, "b": 0.5}  # no positive regret: uniform
    for _ in range(50):
        learner.update({"a": 0.2, "b": 0.6})
    w = learner.weights()
    assert abs(sum(w.values()) - 1.0) < 1e-9 and w["a"] > 0.99


def test_normalhedge_weights_solve_the_papers_equation() -> None:
    """w ∝ R₊·exp(R₊²/2c) with c the root of mean exp(R₊²/2c) = e: read c back from two
    weights and check the equation (Chaudhuri, Freund, Hsu 2009)."""
    rng = random.Random(7)
    for _ in range(200):
        regret = [rng.uniform(0.05, 3.0) * rng.choice([1.0, 10.0]) for _ in range(rng.choice([2, 3, 5]))]
        regret.append(-rng.uniform(0.0, 1.0))  # one with negative regret: weight 0
        w = _normalhedge_weights(regret)
        assert abs(sum(w) - 1.0) < 1e-12 and w[-1] == 0.0
        i, j = (
            max(range(len(w) - 1), key=lambda k: regret[k]),
            min(range(len(w) - 1), key=lambda k: regret[k]),
        )
        if regret[i] - regret[j] < 1e-3:
            continue
        log_ratio = math.log((w[i] * regret[j]) / (w[j] * regret[i]))  # (R_i² − R_j²) / 2c
        c = (regret[i] ** 2 - regret[j] ** 2) / (2.0 * log_ratio)
        mean = sum(math.exp(max(r, 0.0) ** 2 / (2.0 * c)) for r in regret) / len(regret)
        assert mean == pytest.approx(math.e, rel=1e-6)


def test_hedge_weights_and_new_experts() -> None:
    learner = ExpertLearner("hedge", discount=0.9)
    for _ in range(30):
        learner.update({"a": 0.2, "b": 0.6})
    learner.update({"a": 0.2, "b": 0.6, "c": 0.2})  # c joins late with a neutral score
    w = learner.weights()
    assert w["a"] > w["b"] and w["c"] > w["b"]
