"""Batch-size buckets and gamma_table construction."""

from __future__ import annotations

import pytest

from planner.policies.buckets import Buckets, upper_bounds
from planner.sim.worker import gamma_for
from shared.control import ALL_BATCHES


def test_schemes() -> None:
    assert upper_bounds("pow2") == [1, 2, 4, 8, 16, 32, 64, 128, 256, ALL_BATCHES]
    assert upper_bounds("pairs") == [2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, ALL_BATCHES]
    assert upper_bounds([4, 32]) == [4, 32, ALL_BATCHES]
    with pytest.raises(ValueError):
        upper_bounds([4, 4])
    with pytest.raises(ValueError):
        upper_bounds("log")


def test_index_and_representative() -> None:
    b = Buckets("pow2")
    assert [b.index(x) for x in (0, 1, 2, 3, 4, 5, 256, 257, 10**6)] == [0, 0, 1, 2, 2, 3, 8, 9, 9]
    assert b.representative(2) == 4 and b.representative(9) == 512
    pairs = Buckets("pairs")
    assert pairs.index(1) == pairs.index(2) == 0 and pairs.index(23) == 11 == pairs.index(500)


def test_table_merges_neighbours_and_matches_lookup() -> None:
    b = Buckets([2, 8])
    table = b.table([3, 3, 0])
    assert table == [(8, 3), (ALL_BATCHES, 0)]
    assert [gamma_for(table, x) for x in (1, 8, 9)] == [3, 3, 0]
    with pytest.raises(ValueError):
        b.table([1, 2])
