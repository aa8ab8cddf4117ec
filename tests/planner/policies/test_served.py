"""The served calibration (planner/policies/served.py): batch classes, the nearest class's
entry, the bare profile when calibration is off, and the state layout the nightjar policy
saved before the calibration was its own module."""

from __future__ import annotations

import pytest

from planner.policies.served import KNOWN_STEPS, RATIO_WEIGHT, ServedCalibration, move, nearest
from shared.control import Telemetry, batch_class
from shared.profile import CostProfile


def test_batch_classes_are_powers_of_two() -> None:
    assert [batch_class(b) for b in (0, 1, 2, 3, 4, 7, 8, 16, 31, 32)] == [1, 1, 2, 2, 3, 3, 4, 5, 5, 6]


def test_nearest_takes_the_class_then_the_closest_the_smaller_on_a_tie() -> None:
    table = {1: 1.5, 5: 3.0}
    assert nearest(table, 5, 0.0) == 3.0
    assert nearest(table, 2, 0.0) == 1.5
    assert nearest(table, 3, 0.0) == 1.5  # 1 and 5 are both 2 away: the smaller
    assert nearest(table, 6, 0.0) == 3.0
    assert nearest({}, 3, 0.25) == 0.25


def test_a_step_moves_a_mean_a_twentieth_of_the_way_by_its_share() -> None:
    assert move(1.0, 3.0) == pytest.approx(1.1)
    assert move(1.0, 3.0, share=0.5) == pytest.approx(1.05)


def test_without_calibration_it_prices_the_bare_profile() -> None:
    served = ServedCalibration(calibrate=False)
    t = Telemetry(worker_id="w", batch_size=4, num_tokens=4, step_time=1.0, gap_time=0.01, mean_context=50.0)
    served.observe(t)
    assert served.ratio_plain == {} and served.gap_plain == {} and served.gap_extra == {}
    assert served.ratio(4) == 1.0 and served.ratio(4, "head") == 1.0
    assert served.gap_at(4, spec=False) == 0.0 and served.scoring_at(4) == 0.0
    assert served.context == 50.0  # the context is the served steps', calibrated or not


def test_a_state_saved_by_the_policy_before_the_split_loads_and_prices_the_same() -> None:
    state = {
        "context": 120.0,
        "ratio_plain": {"1": 1.8, "5": 1.2},
        "plain_steps": {"1": 40, "5": 3},
        "spec_excess": {"1": 1.1},
        "drafter_excess": {"head": {"1": 1.3}},
        "gap": {"plain": {"1": 0.0004}, "spec": {"1": 0.0006}},
        "scoring": {"1": 0.0002},
    }
    served = ServedCalibration()
    served.load_state_dict(state)
    assert served.ratio(1, "head") == pytest.approx(1.8 * 1.3)
    assert served.ratio(1, "ngram") == pytest.approx(1.8 * 1.1)  # no own excess: the class's shared
    assert served.gap_at(1, spec=True) == pytest.approx(0.0006)
    assert served.gap_at(16, spec=True) == 0.0004  # a class that never speculated: the plain gap
    assert served.scoring_at(1) == 0.0002 and served.scoring_at(16) == 0.0
    assert served.spec_learned == {1: 1.0} and served.drafter_learned == {"head": {1: 1.0}}
    again = ServedCalibration()
    again.load_state_dict(served.state_dict())
    assert again.state_dict() == served.state_dict()


def _profile() -> CostProfile:
    return CostProfile(
        model="m",
        batches=[1, 4],
        rows=[1, 3],
        target_s=[[0.002, 0.003], [0.004, 0.006]],
        drafter_s={"head": [0.0005, 0.001]},
    )


def test_a_speculative_steps_gap_is_the_plain_gap_and_its_learned_extra() -> None:
    """The first speculative step of a class does not set its gap: a warm-up step's 7 ms
    (prompts arriving) priced speculating out at one sequence on nj-target, where its gap is
    2.6 ms beside the plain step's 2.2, and nothing speculated there again to correct it."""
    served = ServedCalibration()
    served.profile = _profile()
    for _ in range(40):
        served.observe(_step(gap=0.002))
    served.observe(_step(gap=0.007, gamma=2))
    assert served.gap_at(1, spec=True) == pytest.approx(0.002 + RATIO_WEIGHT * 0.005)
    for _ in range(200):
        served.observe(_step(gap=0.0026, gamma=2))
    assert served.gap_at(1, spec=True) == pytest.approx(0.0026, rel=0.01)
    assert served.gap_at(1, spec=False) == pytest.approx(0.002)


def test_an_excess_of_few_steps_keeps_its_prior_when_the_plain_ratio_becomes_the_class_own() -> None:
    """A class's excess is learned from its speculative steps; when its plain ratio turns from
    carried to its own, only the learned part keeps its price in seconds. Scaled whole, one
    warm-up step's excess (1.04) doubled on nj-target and speculating was priced out."""
    served = ServedCalibration()
    served.profile = _profile()
    for _ in range(KNOWN_STEPS):  # the class of 4 is known: plain steps at 3x their profile
        served.observe(_step(batch=4, time=0.012))
    served.observe(_step(time=3.0 * 0.0035, gamma=2, shares={"head": 1}))  # one step at one sequence
    carried = served.plain_ratio(1)
    one = served.ratio(1, "head")
    assert served.spec_learned[1] == pytest.approx(RATIO_WEIGHT)
    for _ in range(KNOWN_STEPS):  # the class of 1 serves plain steps at its profile
        served.observe(_step(time=0.002))
    assert carried / served.plain_ratio(1) > 2.0  # its own ratio is half the carried one
    # the learned twentieth kept its price; the rest is the prior, as the profile prices it
    excess = one / carried
    expected = (1.0 - RATIO_WEIGHT) + (excess - (1.0 - RATIO_WEIGHT)) * carried / served.ratio_plain[1]
    assert served.drafter_excess["head"][1] == pytest.approx(expected, rel=1e-6)
    assert served.ratio(1, "head") < 1.3 * served.plain_ratio(1)


def _step(
    batch: int = 1,
    time: float = 0.002,
    gap: float = 0.0,
    gamma: int = 0,
    shares: dict[str, int] | None = None,
) -> Telemetry:
    drafting = {"proposed": gamma * batch, "num_drafts": batch, "drafter_shares": shares or {"head": batch}}
    return Telemetry(
        worker_id="w",
        batch_size=batch,
        num_tokens=batch,
        step_time=time,
        gap_time=gap,
        gamma=gamma,
        **(drafting if gamma else {}),
    )


def test_a_state_saved_before_the_plain_step_counts_takes_every_class_as_known() -> None:
    served = ServedCalibration()
    served.load_state_dict({"ratio_plain": {"1": 1.8, "5": 1.2}})
    assert served.plain_steps == {1: KNOWN_STEPS, 5: KNOWN_STEPS}
    assert served.plain_ratio(5) == 1.2  # its own, not carried from another class
