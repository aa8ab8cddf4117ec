"""The simulator's curves come from the cost-profile format: the built-in tables are profiles,
a worker's profile (JSON) becomes curves, and a measured catch-up replaces the assumed one."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.sim.curves import (
    RANDOM_INIT,
    RANDOM_INIT_PROFILE,
    SMOLLM2,
    SMOLLM2_PROFILE,
    CostCurves,
    load_curves,
)
from planner.sim.scenario import Phase, Scenario
from shared.profile import CostProfile


@pytest.mark.parametrize(
    ("curves", "profile"), [(RANDOM_INIT, RANDOM_INIT_PROFILE), (SMOLLM2, SMOLLM2_PROFILE)]
)
def test_built_in_curves_are_their_profiles(curves: CostCurves, profile: CostProfile) -> None:
    for batch in (1, 3, 4, 16, 50, 100):
        for q in (1, 2, 4, 9, 12):
            assert curves.target(batch, q) == pytest.approx(profile.target(batch, q))
        assert curves.draft(batch) == pytest.approx(profile.draft(batch))
        for gamma in range(5):
            assert curves.step(batch, gamma) == pytest.approx(profile.step(batch, gamma))
    back = CostCurves.from_profile(curves.to_profile())
    for mine, theirs in zip(back.target_ms, curves.target_ms, strict=True):
        assert mine == pytest.approx(theirs)
    assert back.draft_ms == pytest.approx(curves.draft_ms)


def worker_profile() -> CostProfile:
    return CostProfile(
        model="nj-target", batches=[1, 16], rows=[1, 2, 3, 4, 5],
        target_s=[[0.004, 0.0045, 0.005, 0.0055, 0.006], [0.010, 0.016, 0.022, 0.028, 0.034]],
        drafter_s={"ngram": [0.0001, 0.0003], "nj-draft-code": [0.001, 0.002]},
        catch_up_s={"nj-draft-code": [0.0002, 0.0008]},
    )  # fmt: skip


def test_a_worker_profile_drives_the_simulator(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    path.write_text(worker_profile().dumps())
    curves = load_curves(path, drafter="nj-draft-code")
    assert curves.name == "nj-target" and curves.draft(16) == pytest.approx(0.002)
    assert curves.draft(16, "ngram") == pytest.approx(0.0003)  # each drafter keeps its own curve
    sc = Scenario(phases=[Phase(10, 1)], curves=curves, acceptance={"nj-draft-code": {"default": 0.7}})
    assert sc.catch_up(16, 10) == pytest.approx(10 * 0.0008)  # measured, not switch_scale · draft
    assert sc.expected_latency(1, 2, "ngram", "default") == pytest.approx(
        (2 * 0.0001 + 0.005) / sc.expected_tokens(0.7, 2)  # ngram's own step cost, the default's α
    )


def test_without_a_measured_catch_up_the_scenario_assumes_one() -> None:
    sc = Scenario(phases=[Phase(10, 4)])
    assert RANDOM_INIT.catch_up(4, 10) is None
    assert sc.catch_up(4, 10) == pytest.approx(sc.switch_scale * 10 * RANDOM_INIT.draft(4))
