"""BinGreedy: block and bin structure, bin ends under delayed feedback, greedy with switch costs."""

from __future__ import annotations

import numpy as np
import pytest

from planner.policies.bingreedy import BinGreedy
from planner.policies.signals import Draws


def test_blocks_double_and_bins_are_sqrt_long() -> None:
    b = BinGreedy(3)
    draws = Draws(0)
    b.start_bin(draws)
    layout = []
    for _ in range(40):
        layout.append((b.block, b.bin, b.bin_length))
        while not b.tick(b.arm, True):
            pass
        b.start_bin(draws)
    # block j: 2^(j-1) steps in bins of max(1, ⌊√H_j⌋)
    assert layout[:6] == [(1, 1, 1), (2, 1, 1), (2, 2, 1), (3, 1, 2), (3, 2, 2), (4, 1, 2)]
    assert (7, 1, 8) in layout and (7, 8, 8) in layout and (7, 9, 8) not in layout


def test_bin_waits_for_its_own_arm_within_the_slack() -> None:
    b = BinGreedy(3, slack=4)
    b.arm = 2
    assert not b.tick(0, True)  # a step of the previous arm, still in flight
    assert b.tick(2, True)  # the bin (length 1) ran its arm
    b.matched = b.seen = 0
    assert not any(b.tick(1, False) for _ in range(50))  # could not run it: wait
    assert [b.tick(1, True) for _ in range(5)][-1]  # length + slack seen: give up


def test_rewards_are_ratio_of_sums() -> None:
    b = BinGreedy(2)
    b.record(1, 0.010, 1.0)
    b.record(1, 0.010, 4.0)
    assert b.means[1] == pytest.approx(0.020 / 5.0)
    assert b.best() == 1


def test_greedy_untried_first_then_least_loss() -> None:
    b = BinGreedy(3)
    b.record(0, 0.010, 1.0)
    assert b.greedy() == 1
    b.record(1, 0.009, 1.0)
    b.record(2, 0.008, 1.0)
    assert b.greedy() == 2


def test_greedy_charges_switch_costs() -> None:
    b = BinGreedy(3)
    for arm, loss in ((0, 0.010), (1, 0.009), (2, 0.0085)):
        b.record(arm, loss, 1.0)
    assert b.greedy() == 2
    n = b.bin_length
    # turning speculation on now costs C/(γ·n) per step: 0.004/(2n) > the 0.0015 gain
    assert b.greedy(switch_now=0.004 * n) == 0
    assert b.greedy(switch_on=0.004) == 0  # entries from γ = 0 buckets
    assert b.greedy(switch_off=0.002) == 2  # γ = 0 here would make others pay


def test_exploration_thins_out() -> None:
    b = BinGreedy(5)
    draws = Draws(1)
    explored = []
    for _ in range(3000):
        b.start_bin(draws)
        explored.append((b.block, b.explore))
    early = [e for blk, e in explored if blk <= 6]
    late = [e for blk, e in explored if blk >= 18]
    assert sum(early) / len(early) > 2 * sum(late) / len(late)
    for rule in ("paper", "fork", "per-block"):
        BinGreedy(2, rule)
    with pytest.raises(ValueError):
        BinGreedy(2, "sometimes")


def test_state_round_trip() -> None:
    b = BinGreedy(3)
    b.start_bin(Draws(0))
    b.record(2, 0.01, 2.0)
    b.tick(2, True)
    c = BinGreedy(3)
    c.load_state_dict(b.state_dict())
    assert c.state_dict() == b.state_dict()
    with pytest.raises(ValueError):
        BinGreedy(4).load_state_dict(b.state_dict())


def test_clearly_worse_arms_retire_from_exploration() -> None:
    b = BinGreedy(3)
    rng = np.random.default_rng(0)
    for _ in range(40):
        b.record(0, 0.010 * (1 + 0.05 * rng.standard_normal()), 1.0)
        b.record(1, 0.0102 * (1 + 0.05 * rng.standard_normal()), 1.0)  # within the noise
        b.record(2, 0.020 * (1 + 0.05 * rng.standard_normal()), 1.0)  # twice as slow
    assert b.plausible() == [0, 1]
    draws = Draws(2)
    arms = set()
    for _ in range(300):
        b.start_bin(draws)
        if b.explore:
            arms.add(b.arm)
    assert arms == {0, 1}
    fresh = BinGreedy(3)
    fresh.record(2, 0.5, 1.0)
    assert fresh.plausible() == [0, 1, 2]  # too few samples to judge
