"""Baselines: threshold cuts at its batch size; ucb and exp3 concentrate on the best γ
without context; cost-model picks k = 0 at low acceptance and k > 0 at high."""

from __future__ import annotations

from collections import Counter

import pytest

from planner.baselines.cost_model import CostModelPolicy
from planner.policies import registry
from planner.sim import Phase, Scenario, SimWorker
from planner.sim.worker import gamma_for
from shared.control import Telemetry
from tests.planner.scenarios import run


def test_threshold_cuts_at_the_batch_size() -> None:
    table = registry.create("threshold", gamma=3, max_batch=16).decide(0.0).gamma_table
    assert [gamma_for(table, b) for b in (1, 8, 16, 17, 64, 10_000)] == [3, 3, 3, 0, 0, 0]
    sc = Scenario(phases=[Phase(10, 8), Phase(10, 32)])
    _, trace = run("threshold", sc, 40, gamma=2, max_batch=16)
    assert {(b, g) for b, g in zip(trace.batch, trace.gamma, strict=True)} == {(8, 2), (32, 0)}


def _one_batch(batch: int, alpha: float) -> Scenario:
    return Scenario(phases=[Phase(100, batch)], acceptance={"d": {"default": alpha}})


@pytest.mark.parametrize("name", ["ucb", "exp3"])
@pytest.mark.parametrize("reward", ["goodput", "latency"])
@pytest.mark.parametrize(("batch", "alpha", "best"), [(1, 0.7, 4), (64, 0.5, 0)])
def test_bandits_concentrate_on_the_best_gamma(
    name: str, reward: str, batch: int, alpha: float, best: int
) -> None:
    sc = _one_batch(batch, alpha)
    assert sc.optimal_gamma(batch, 4, "d", "default") == best
    _, trace = run(name, sc, 3000, seed=1, reward=reward)
    share = Counter(trace.gamma[1500:])[best] / 1500
    assert share > 0.5, (name, reward, batch, Counter(trace.gamma[1500:]))


def test_bandits_have_no_context() -> None:
    """One γ for every batch size: the table has a single row."""
    for name in ("ucb", "exp3"):
        assert len(registry.create(name).decide(0.0).gamma_table) == 1


def test_ucb_tries_every_arm_first() -> None:
    pol = registry.create("ucb", gamma_max=4)
    seen = []
    for step in range(5):
        g = pol.decide(0.0).gamma_table[0][1]
        seen.append(g)
        pol.observe(Telemetry(worker_id="w", step=step, batch_size=4, gamma=g, num_tokens=4 + g,
                              step_time=0.02))  # fmt: skip
    assert seen == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(("alpha", "want_zero"), [(0.2, True), (0.9, False)])
def test_cost_model_k_zero_when_acceptance_is_low(alpha: float, want_zero: bool) -> None:
    pol, trace = run("cost-model", _one_batch(1, alpha), 400, seed=0)
    assert isinstance(pol, CostModelPolicy)
    k = pol.best_length(pol.buckets.index(1))
    assert (k == 0) == want_zero, (alpha, k, pol.alpha)
    ran = Counter(trace.gamma[200:]).most_common(1)[0][0]
    assert (ran == 0) == want_zero
    assert abs(pol.alpha - alpha) < 0.1


def test_cost_model_uses_measured_costs() -> None:
    """At batch 64 the measured verify cost makes speculation lose at α = 0.5 (k = 0), while
    at batch 1 with the same α it pays (random-init curves)."""
    sc = Scenario(phases=[Phase(200, 1), Phase(200, 64)], acceptance={"d": {"default": 0.5}})
    pol, _ = run("cost-model", sc, 1600, seed=0, gamma_max=4)
    assert isinstance(pol, CostModelPolicy)
    assert pol.best_length(pol.buckets.index(64)) == 0
    assert pol.costs.verify(pol.buckets.index(64), 0) == pytest.approx(0.058, rel=0.1)


def test_cost_model_lengths_are_capped() -> None:
    pol = registry.create("cost-model", gamma_max=5)
    assert isinstance(pol, CostModelPolicy)
    assert pol.lengths == [0, 1, 2, 4]


def test_cost_model_probes_its_stalest_length() -> None:
    pol = registry.create("cost-model", probe_every=10, gamma_max=2)
    worker = SimWorker(_one_batch(4, 0.6), seed=0)
    gammas = []
    for _ in range(60):
        t = worker.step(pol.decide(worker.clock))
        gammas.append(t.gamma)
        pol.observe(t)
    assert set(gammas) == {0, 1, 2}
