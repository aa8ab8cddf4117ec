"""C_switch model: prior until measured, interpolated table, per-drafter with pooled fallback."""

from __future__ import annotations

import pytest

from planner.policies.switch_cost import SwitchCostModel
from shared.control import SwitchCostEvent


def _ev(tokens: int, batch: int, seconds: float, drafter: str = "d") -> SwitchCostEvent:
    return SwitchCostEvent(drafter=drafter, batch_size=batch, tokens=tokens, seconds=seconds)


def test_prior_until_measured() -> None:
    m = SwitchCostModel(per_token_seq=1e-4, fixed=1e-3)
    assert not m.measured()
    assert m.cost("d", 10, 4) == pytest.approx(1e-3 + 1e-4 * 40)
    assert m.cost("d", 0, 4) == 0.0


def test_interpolates_a_measured_surface() -> None:
    """The truth is 2e-5·tokens·batch^0.8 + 5 ms; measured on the power-of-two grid, the
    model must reproduce it between grid points within a few percent."""

    def truth(tokens: float, batch: float) -> float:
        return 2e-5 * tokens * batch**0.8 + 0.005

    m = SwitchCostModel()
    for tokens in (2, 4, 8, 16, 32, 64, 128, 256):
        for batch in (1, 2, 4, 8, 16, 32, 64):
            m.observe(_ev(tokens, batch, truth(tokens, batch)))
    assert m.measured("d")
    for tokens, batch in ((3, 3), (24, 12), (100, 40), (200, 5)):
        assert m.cost("d", tokens, batch) == pytest.approx(truth(tokens, batch), rel=0.08)


def test_one_measurement_rescales_the_prior_everywhere() -> None:
    m = SwitchCostModel(per_token_seq=1e-4, fixed=0.0)
    m.observe(_ev(16, 8, 2 * 1e-4 * 16 * 8))  # twice the prior
    assert m.cost("d", 64, 32) == pytest.approx(2 * m.prior(64, 32))


def test_unknown_drafter_uses_the_pooled_table() -> None:
    m = SwitchCostModel(per_token_seq=1e-4, fixed=0.0)
    m.observe(_ev(16, 8, 3 * m.prior(16, 8), drafter="a"))
    assert m.cost("b", 16, 8) == pytest.approx(3 * m.prior(16, 8))
    assert m.cost(None, 16, 8) == pytest.approx(3 * m.prior(16, 8))


def test_ignores_empty_events_and_round_trips() -> None:
    m = SwitchCostModel()
    m.observe(_ev(0, 8, 1.0))
    assert not m.measured()
    m.observe(_ev(8, 8, 0.02))
    c = SwitchCostModel()
    c.load_state_dict(m.state_dict())
    assert c.cost("d", 8, 8) == m.cost("d", 8, 8)
