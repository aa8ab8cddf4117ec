"""The cost profile record: shape checks, interpolation, catch-up, JSON round trip."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from shared.profile import CostProfile


def profile(**kw: object) -> CostProfile:
    base: dict[str, object] = {
        "model": "m",
        "batches": [1, 8],
        "rows": [1, 2, 5],
        "target_s": [[0.010, 0.012, 0.020], [0.020, 0.030, 0.060]],
        "drafter_s": {"ngram": [0.0001, 0.0002], "code": [0.002, 0.004]},
        "catch_up_s": {"code": [0.001, 0.003]},
        "num_blocks": 512,
    }
    return CostProfile(**(base | kw))  # type: ignore[arg-type]


def test_interpolates_over_batch_and_rows_and_extends_linearly() -> None:
    p = profile()
    assert p.target(1, 1) == pytest.approx(0.010) and p.target(8, 5) == pytest.approx(0.060)
    assert p.target(1, 3) == pytest.approx(0.012 + (0.020 - 0.012) / 3)
    assert p.target(4.5, 1) == pytest.approx(0.015)
    assert p.target(15, 1) == pytest.approx(0.030)  # past the last batch: the line goes on
    assert p.gamma_max == 4
    assert p.draft(8, "code") == pytest.approx(0.004) and p.draft(8) == pytest.approx(0.0002)  # first: ngram
    assert p.step(1, 4, "code") == pytest.approx(4 * 0.002 + 0.020)
    assert p.catch_up(8, 10, "code") == pytest.approx(0.03)
    assert p.catch_up(1, 10, "ngram") == pytest.approx(0.01)  # not measured for ngram: the first measured
    assert profile(catch_up_s={}).catch_up(1, 10) is None
    assert profile(drafter_s={}).draft(4) == 0.0


def test_json_round_trip() -> None:
    p = profile(worker_id="w1", measure_s=3.5)
    assert CostProfile.loads(p.dumps()) == p


@pytest.mark.parametrize(
    "bad",
    [
        {"batches": [8, 1]},
        {"rows": [0, 1, 2]},
        {"target_s": [[0.01, 0.01, 0.01]]},
        {"drafter_s": {"x": [0.1]}},
        {"catch_up_s": {"x": [0.1, 0.2, 0.3]}},
        {"target_s": [[0.01, -1.0, 0.01], [0.01, 0.01, 0.01]]},
        {"target_s": [[0.01, float("nan"), 0.01], [0.01, 0.01, 0.01]]},
        {"model": ""},
        {"colour": "red"},
    ],
)
def test_bad_shapes_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        profile(**bad)


def test_a_second_context_makes_the_target_linear_in_context() -> None:
    """Measured at ~30 and ~140 tokens a sequence, the target at 250 is on the line through
    both (a forward attends over and gathers the whole context); without a context asked, or
    without the second table, it is the first one's."""
    long = [[0.015, 0.018, 0.030], [0.030, 0.045, 0.090]]
    p = profile(context=30.0, long_context=140.0, long_target_s=long)
    assert p.target(8, 5) == pytest.approx(0.060)
    assert p.target(8, 5, 140.0) == pytest.approx(0.090)
    assert p.target(8, 5, 250.0) == pytest.approx(0.060 + (0.090 - 0.060) * 220 / 110)
    assert p.target(1, 1, 85.0) == pytest.approx(0.0125)
    assert p.step(1, 4, "code", 140.0) == pytest.approx(4 * 0.002 + 0.030)
    assert profile(context=30.0).target(8, 5, 250.0) == pytest.approx(0.060)
    assert CostProfile.loads(p.dumps()) == p
    with pytest.raises(ValidationError):
        profile(context=30.0, long_context=140.0, long_target_s=long[:1])
    with pytest.raises(ValidationError):
        profile(context=140.0, long_context=30.0, long_target_s=long)
