"""The request plan: same prompts, lengths and times for every configuration of a run."""

from __future__ import annotations

import pytest

from benchmarks.load.phases import parse_phases
from benchmarks.load.plan import LengthRule, build_plan, usable_items, warmup_requests
from benchmarks.load.workloads import Workload, WorkloadItem

ITEMS = [
    WorkloadItem("a", "x", "short prompt", reference="one two three four five six"),
    WorkloadItem("b", "x", "a much longer prompt than the others here", max_tokens=40),
    WorkloadItem("c", "y", "third", reference=None),
]


def words(text: str) -> int:
    return len(text.split())


def test_plan_is_reproducible_and_cycles_the_prompts() -> None:
    phases = parse_phases("a:5:4,b:1:2")
    plan = build_plan(ITEMS, phases, seed=1, lengths=LengthRule("fixed", 16))
    again = build_plan(ITEMS, phases, seed=1, lengths=LengthRule("fixed", 16))
    assert plan == again
    assert [r.index for r in plan] == list(range(len(plan)))
    assert {r.max_tokens for r in plan} == {16}
    ids = [r.item.id for r in plan]
    assert sorted(set(ids)) == ["a", "b", "c"]
    assert ids[:3] == ids[3:6]  # a shuffle of the workload, then the same order again
    assert len({r.seed for r in plan}) == len(plan)


def test_workload_lengths_use_the_item_then_its_reference_clamped() -> None:
    rule = LengthRule("workload", max_tokens=32, min_tokens=2)
    assert rule.tokens_for(ITEMS[0], words) == 6
    assert rule.tokens_for(ITEMS[1], words) == 32  # asks for 40, capped
    assert rule.tokens_for(ITEMS[2], words) == 32  # nothing known: the cap
    assert LengthRule("workload", 32, 10).tokens_for(ITEMS[0], words) == 10


def test_length_rule_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        LengthRule("random")
    with pytest.raises(ValueError):
        LengthRule("fixed", max_tokens=4, min_tokens=8)


def test_usable_items_filters_long_prompts() -> None:
    w = Workload("mem", "prompt", list(ITEMS))
    assert [i.id for i in usable_items(w, words, 3)] == ["a", "c"]
    assert len(usable_items(w, None, 3)) == 3


def test_warmup_requests_stay_out_of_the_plan_windows() -> None:
    warm = warmup_requests(ITEMS, 4, 8)
    assert [(r.index, r.window, r.max_tokens) for r in warm] == [
        (-1, -1, 8),
        (-2, -1, 8),
        (-3, -1, 8),
        (-4, -1, 8),
    ]
