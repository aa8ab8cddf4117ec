"""The runner: delayed feedback, and regret measured against the oracle."""

from __future__ import annotations

from typing import Any

from planner.policies import registry
from planner.policies.base import Choice, Policy
from planner.sim import Phase, Runner, Scenario, SimWorker
from shared.control import Telemetry


class Recorder(Policy):
    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.seen: list[int] = []
        self.decisions = 0

    def observe(self, t: Telemetry) -> None:
        self.seen.append(t.step)

    def decide(self, now: float) -> Choice:
        self.decisions += 1
        return Choice(gamma_table=[(1 << 30, 1)])


def test_feedback_arrives_delay_steps_late() -> None:
    pol = Recorder()
    Runner(pol, SimWorker(Scenario(phases=[Phase(10, 2)])), delay=3, decide_every=2).run(10)
    assert pol.seen == list(range(7)) and pol.decisions == 5


def test_oracle_has_zero_regret_and_others_pay() -> None:
    sc = Scenario(phases=[Phase(10, 1)], acceptance={"d": {"default": 0.7}})
    best = sc.optimal_gamma(1, 4, "d", "default")
    oracle = Runner(registry.create("static", gamma=best), SimWorker(sc)).run(200)
    assert abs(oracle.cumulative_regret()) < 1e-9 and oracle.switches_on == 1
    worse = Runner(registry.create("static", gamma=0), SimWorker(sc)).run(200)
    gap = sc.expected_latency(1, 0, "d", "default") - sc.expected_latency(1, best, "d", "default")
    assert abs(worse.cumulative_regret() - 200 * gap) < 1e-9


def test_switching_is_charged() -> None:
    """Alternating γ: the catch-ups show up in regret and switch counts."""
    sc = Scenario(phases=[Phase(10, 4)], acceptance={"d": {"default": 0.7}}, noise=0.0)

    class Flip(Recorder):
        def decide(self, now: float) -> Choice:
            self.decisions += 1
            return Choice(gamma_table=[(1 << 30, 3 * (self.decisions // 5 % 2))])

    trace = Runner(Flip(), SimWorker(sc)).run(100)
    assert trace.switches_on == 10 and trace.switch_seconds > 0
