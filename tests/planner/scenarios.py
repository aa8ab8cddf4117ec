"""Run helper shared by the planner policy tests (the worlds live in planner.sim.worlds)."""

from __future__ import annotations

from typing import Any

from planner.policies import registry
from planner.policies.base import Policy
from planner.sim import Runner, Scenario, SimWorker, Trace
from planner.sim.worlds import busy_and_quiet, drafter_shift, four_batches, small_gain, smollm2_mixed

__all__ = ["busy_and_quiet", "drafter_shift", "four_batches", "run", "small_gain", "smollm2_mixed"]


def run(
    policy: Policy | str, scenario: Scenario, steps: int, seed: int = 0, delay: int = 3, **params: Any
) -> tuple[Policy, Trace]:
    pol = registry.create(policy, **params) if isinstance(policy, str) else policy
    return pol, Runner(pol, SimWorker(scenario, seed=seed), delay=delay).run(steps)
