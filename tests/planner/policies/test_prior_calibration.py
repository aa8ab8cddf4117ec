"""The prior's calibration to serving: served-minus-profiled seconds added to every arm, and
predictions at the served context (planner/policies/prior.py, shared/profile.py)."""

from __future__ import annotations

import pytest

from planner.policies.bingreedy import BinGreedy
from planner.policies.prior import ProfilePrior, arm_intervals, expected_tokens
from shared.control import Telemetry
from shared.profile import CostProfile


def test_serving_overhead_is_added_to_every_arm_not_multiplied() -> None:
    """With the context profiled, served steps take ~3 ms more than the profile's at every γ
    (the step's bookkeeping); the profile's extra rows cost what they cost. Calibrated by the
    seconds measured − predicted, γ = 4 (the best, in truth) stays predicted best after γ = 2
    alone has been measured; stretched by the ratio, the rows would cost 1.5× as much and γ = 3
    would look better."""
    rows = [1, 2, 3, 4, 5]
    profile = CostProfile(
        model="fake", batches=[1, 4, 16], rows=rows, source="test",
        target_s=[[0.0045 + 0.0008 * (q - 1) for q in rows]] * 3, drafter_s={"d": [0.00002] * 3},
        context=30.0, long_context=140.0, long_target_s=[[0.0045 + 0.0008 * (q - 1) for q in rows]] * 3,
    )  # fmt: skip
    prior = ProfilePrior()
    prior.use(profile)
    for _ in range(200):
        prior.observe(Telemetry(worker_id="w", step=1, batch_size=4, num_tokens=8, step_time=0.01, gamma=2,
                                drafter="d", counterfactual={"d": 0.7}))  # fmt: skip
    bandit = BinGreedy(5)

    def truth(gamma: int) -> float:  # served seconds a step
        step = prior.step(4, gamma, "d")
        assert step is not None
        return step + 0.003

    for _ in range(20):
        bandit.record(2, truth(2), expected_tokens(0.7, 2))
    ivs = arm_intervals(prior, bandit, 4, "d")
    assert ivs is not None and all(iv is not None for iv in ivs)
    true = [truth(g) / expected_tokens(0.7, g) for g in range(1, 5)]
    assert min(range(4), key=lambda i: true[i]) == 3
    got = [iv.mean for iv in ivs[1:] if iv is not None]
    assert got == pytest.approx(true, rel=0.02)
    assert min(range(4), key=lambda i: got[i]) == 3


def test_predictions_are_at_the_served_context() -> None:
    """With the target measured at two contexts, a prediction is at the moving mean of the
    steps' tokens per sequence: served sequences of ~250 tokens cost what the line through
    the profile's ~30 and ~140 says, not the short prompts' time."""
    rows = [1, 2, 3]
    profile = CostProfile(
        model="fake", batches=[1, 32], rows=rows, source="test",
        target_s=[[0.002, 0.0025, 0.003], [0.008, 0.013, 0.018]],
        context=30.0, long_context=140.0,
        long_target_s=[[0.003, 0.0035, 0.004], [0.012, 0.018, 0.025]],
        drafter_s={"d": [0.0001, 0.0002]},
    )  # fmt: skip
    prior = ProfilePrior()
    prior.use(profile)
    assert prior.step(32, 0) == pytest.approx(0.008)  # no step seen: the first table
    for step in range(200):
        prior.observe(Telemetry(worker_id="w", step=step, batch_size=32, num_tokens=32, step_time=0.02,
                                mean_context=250.0))  # fmt: skip
    assert prior.context == pytest.approx(250.0)
    assert prior.step(32, 0) == pytest.approx(0.008 + 0.004 * 220 / 110)
    assert prior.step(32, 2, "d") == pytest.approx(2 * 0.0002 + 0.018 + 0.007 * 220 / 110)
    restored = ProfilePrior()
    restored.load_state_dict(prior.state_dict())
    assert restored.context == prior.context
