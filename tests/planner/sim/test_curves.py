"""Cost curves: the measured points come back exactly; interpolation and extrapolation."""

from __future__ import annotations

import pytest

from planner.sim.curves import RANDOM_INIT, SMOLLM2, CostCurves


@pytest.mark.parametrize("curves", [RANDOM_INIT, SMOLLM2])
def test_table_points_are_reproduced(curves: CostCurves) -> None:
    for i, batch in enumerate(curves.batches):
        for k, q in enumerate(curves.qs):
            assert curves.target(batch, q) == pytest.approx(curves.target_ms[i][k] / 1000)
        assert curves.draft(batch) == pytest.approx(curves.draft_ms[i] / 1000)


def test_interpolates_between_and_extends_past_the_table() -> None:
    c = RANDOM_INIT
    assert c.target(10, 1) == pytest.approx((15.7 + (21.9 - 15.7) * 6 / 12) / 1000)
    assert c.target(1, 4) == pytest.approx((15.2 + 12.2) / 2 / 1000)  # q = 4 between 3 and 5
    assert c.target(128, 1) > c.target(64, 1)  # linear extension of the last segment
    assert c.target(64, 17) > c.target(64, 9)
    assert c.step(16, 2) == pytest.approx(2 * c.draft(16) + c.target(16, 3))


def test_smollm2_draft_is_a_fifth_of_a_target_step() -> None:
    assert SMOLLM2.draft(4) == pytest.approx(0.2 * SMOLLM2.target(4, 1))


def test_shape_is_checked() -> None:
    with pytest.raises(ValueError):
        CostCurves("bad", (1, 2), (1,), ((1.0,),), (0.1, 0.2))
