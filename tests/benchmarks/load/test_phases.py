"""The arrival process: phase parsing, Poisson rate per phase, determinism under a seed."""

from __future__ import annotations

import itertools
import math

import pytest

from benchmarks.load.phases import Phase, parse_phases, poisson_arrivals, total_duration, window_at, windows


def test_parse_phases_reads_name_rate_duration() -> None:
    phases = parse_phases("low:0.5:60, high:6:120,low:0.5:60")
    assert phases == [Phase("low", 0.5, 60.0), Phase("high", 6.0, 120.0), Phase("low", 0.5, 60.0)]
    assert total_duration(phases) == 240.0
    ws = windows(phases)
    assert [(w.label, w.start_s, w.end_s) for w in ws] == [
        ("low#0", 0.0, 60.0),
        ("high#1", 60.0, 180.0),
        ("low#2", 180.0, 240.0),
    ]
    assert window_at(ws, 60.0) is ws[1]
    assert window_at(ws, 240.0) is None


@pytest.mark.parametrize("spec", ["", "low:1", "low:x:3", "low:-1:3", "low:1:0", ":1:3"])
def test_parse_phases_rejects_bad_plans(spec: str) -> None:
    with pytest.raises(ValueError):
        parse_phases(spec)


def test_arrivals_are_deterministic_with_a_seed() -> None:
    phases = parse_phases("a:2:50,b:10:50")
    first = [t for t, _ in poisson_arrivals(phases, seed=3)]
    assert first == [t for t, _ in poisson_arrivals(phases, seed=3)]
    assert first != [t for t, _ in poisson_arrivals(phases, seed=4)]
    assert first == sorted(first)


def test_each_phase_gets_its_own_poisson_rate() -> None:
    phases = parse_phases("low:1:2000,high:8:500,off:0:100")
    arrivals = poisson_arrivals(phases, seed=0)
    for w in windows(phases):
        times = [t for t, aw in arrivals if aw.index == w.index]
        assert all(w.start_s <= t < w.end_s for t in times)
        expected = w.phase.rate * w.phase.duration_s
        # A Poisson count has variance equal to its mean: 5 standard deviations is ample.
        assert abs(len(times) - expected) <= 5 * math.sqrt(expected) + 1e-9
        if len(times) > 100:
            gaps = [b - a for a, b in itertools.pairwise(times)]
            mean_gap = sum(gaps) / len(gaps)
            assert mean_gap == pytest.approx(1 / w.phase.rate, rel=0.15)
            # Exponential gaps: the standard deviation equals the mean.
            sd = math.sqrt(sum((g - mean_gap) ** 2 for g in gaps) / len(gaps))
            assert sd == pytest.approx(mean_gap, rel=0.2)
