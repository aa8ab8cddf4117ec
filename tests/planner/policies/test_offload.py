"""Offload rule: squeeze under sustained pressure at γ = 0, expand when load falls, no thrash."""

from __future__ import annotations

import math

from planner.policies.offload import OffloadRule
from shared.control import Telemetry


def _t(free: float, waiting: int = 0, gamma: int = 0, resident: bool = True, total: int = 1000,
       worker: str = "w", ts: float = 0.0) -> Telemetry:  # fmt: skip
    return Telemetry(
        worker_id=worker, ts=ts, batch_size=8, num_tokens=8, gamma=gamma, step_time=0.01,
        free_blocks=int(free * total), total_blocks=total, waiting=waiting, draft_resident=resident,
    )  # fmt: skip


def _feed(rule: OffloadRule, msgs: list[Telemetry]) -> list[bool]:
    out = []
    for m in msgs:
        rule.observe(m)
        out.append(rule.decide())
    return out


def test_squeezes_under_sustained_pressure_at_gamma_zero() -> None:
    rule = OffloadRule(offload_persist=3, offload_zero_steps=16, offload_min_hold=0)
    decisions = _feed(rule, [_t(0.05)] * 20)
    assert decisions.index(True) == 15  # γ = 0 for 16 steps, pressure for ≥ 3
    assert rule.toggles == 1


def test_waiting_requests_count_as_pressure_only_when_memory_is_short() -> None:
    rule = OffloadRule(offload_zero_steps=0, offload_min_hold=0)
    assert not any(_feed(rule, [_t(0.5, waiting=10)] * 30))  # a batch-size cap, not memory
    assert _feed(rule, [_t(0.2, waiting=10)] * 3)[-1]


def test_never_squeezes_while_speculating() -> None:
    rule = OffloadRule(offload_zero_steps=16, offload_min_hold=0)
    assert not any(_feed(rule, [_t(0.01, waiting=5, gamma=2)] * 200))


def test_a_brief_blip_does_not_squeeze() -> None:
    rule = OffloadRule(offload_persist=3, offload_zero_steps=0, offload_min_hold=0)
    msgs = [_t(0.5)] * 5 + [_t(0.05)] * 2 + [_t(0.5)] * 5
    assert not any(_feed(rule, msgs))


def test_expands_when_load_falls() -> None:
    rule = OffloadRule(offload_zero_steps=0, offload_expand_persist=20, offload_min_hold=0)
    assert _feed(rule, [_t(0.02, waiting=3)] * 3)[-1]
    still = _feed(rule, [_t(0.35, resident=False)] * 19)
    assert all(still)
    assert not _feed(rule, [_t(0.35, resident=False)])[-1]
    assert rule.toggles == 2


def test_expand_accounts_for_the_blocks_the_draft_takes_back() -> None:
    """Offloaded, the pool is 1250 blocks; 40 % free there is only 25 % free once the draft's
    250 blocks return — under the 30 % bar, so no expand (it would squeeze right back)."""
    rule = OffloadRule(offload_zero_steps=0, offload_min_hold=0)
    _feed(rule, [_t(0.02, waiting=3, total=1000)] * 3)
    assert rule.offloaded
    assert all(_feed(rule, [_t(0.40, resident=False, total=1250)] * 100))
    assert not _feed(rule, [_t(0.50, resident=False, total=1250)] * 20)[-1]


def test_no_thrashing_when_load_oscillates_around_a_threshold() -> None:
    rule = OffloadRule(offload_zero_steps=0, offload_min_hold=64)
    # free fraction swinging around the squeeze threshold (0.10), period 12 messages
    msgs = [_t(0.10 + 0.03 * math.sin(2 * math.pi * i / 12)) for i in range(3000)]
    _feed(rule, msgs)
    assert rule.toggles <= 1
    # then swinging around the expand threshold (0.30) while offloaded
    rule2 = OffloadRule(offload_zero_steps=0, offload_min_hold=64)
    _feed(rule2, [_t(0.02, waiting=3)] * 3)
    msgs = [_t(0.30 + 0.05 * math.sin(2 * math.pi * i / 12), resident=False) for i in range(3000)]
    _feed(rule2, msgs)
    assert rule2.toggles == 1


def test_hysteresis_bounds_toggles_under_wild_swings() -> None:
    """Load jumping between overload and idle every 30 messages: it follows, but at most one
    toggle per min_hold messages — far fewer than the 100 swings."""
    rule = OffloadRule(offload_zero_steps=0, offload_expand_persist=20, offload_min_hold=100)
    for i in range(3000):
        busy = (i // 30) % 2 == 0
        rule.observe(_t(0.02, waiting=5) if busy else _t(0.9, resident=not rule.offloaded))
        rule.decide()
    assert 2 <= rule.toggles <= 3000 // 100


def test_every_live_worker_must_be_relaxed_to_expand() -> None:
    rule = OffloadRule(offload_zero_steps=0, offload_expand_persist=5, offload_min_hold=0)
    _feed(rule, [_t(0.02, waiting=3, worker="a")] * 3)
    msgs = []
    for i in range(20):
        msgs += [_t(0.9, resident=False, worker="a", ts=i), _t(0.05, resident=False, worker="b", ts=i)]
    assert all(_feed(rule, msgs))
    # worker b goes silent (past the staleness limit): a alone decides
    assert not _feed(rule, [_t(0.9, resident=False, worker="a", ts=100.0 + i) for i in range(6)])[-1]


def test_state_round_trip() -> None:
    rule = OffloadRule(offload_zero_steps=0, offload_min_hold=0)
    _feed(rule, [_t(0.02, waiting=3)] * 3)
    copy = OffloadRule(offload_zero_steps=0, offload_min_hold=0)
    copy.load_state_dict(rule.state_dict())
    assert copy.state_dict() == rule.state_dict() and copy.decide() == rule.decide()
