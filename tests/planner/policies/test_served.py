"""The served calibration (planner/policies/served.py): batch classes, the nearest class's
entry, the bare profile when calibration is off, and the state layout the nightjar policy
saved before the calibration was its own module."""

from __future__ import annotations

import pytest

from planner.policies.served import KNOWN_STEPS, ServedCalibration, move, nearest
from shared.control import Telemetry, batch_class


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
    assert served.ratio_plain == {} and served.gap == {False: {}, True: {}}
    assert served.ratio(4) == 1.0 and served.ratio(4, "head") == 1.0
    assert served.gap_at(4, spec=False) == 0.0 and served.scoring_at(4) == 0.0
    assert served.context == 50.0  # the context is the served steps', calibrated or not


def test_a_state_saved_by_the_policy_before_the_split_loads_and_saves_unchanged() -> None:
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
    assert served.state_dict() == state
    assert served.ratio(1, "head") == pytest.approx(1.8 * 1.3)
    assert served.ratio(1, "ngram") == pytest.approx(1.8 * 1.1)  # no own excess: the class's shared
    assert served.gap_at(1, spec=True) == 0.0006 and served.gap_at(16, spec=True) == 0.0004
    assert served.scoring_at(1) == 0.0002 and served.scoring_at(16) == 0.0


def test_a_state_saved_before_the_plain_step_counts_takes_every_class_as_known() -> None:
    served = ServedCalibration()
    served.load_state_dict({"ratio_plain": {"1": 1.8, "5": 1.2}})
    assert served.plain_steps == {1: KNOWN_STEPS, 5: KNOWN_STEPS}
    assert served.plain_ratio(5) == 1.2  # its own, not carried from another class
