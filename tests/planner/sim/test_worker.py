"""The simulated worker applies choices and reports telemetry like a real one."""

from __future__ import annotations

import numpy as np
import pytest

from planner.policies.base import Choice
from planner.sim import Phase, Scenario, SimWorker
from shared import codec


def _choice(gamma: int, offload: bool = False, drafter: str | None = None, upto: int = 1 << 30) -> Choice:
    return Choice(gamma_table=[(upto, gamma), (1 << 30, 0)], offload=offload, drafter=drafter)


def test_gamma_comes_from_the_table_for_the_batch() -> None:
    w = SimWorker(Scenario(phases=[Phase(1, 4), Phase(1, 8)]), seed=0)
    a, b = w.step(_choice(3, upto=4)), w.step(_choice(3, upto=4))
    assert (a.batch_size, a.gamma, a.proposed) == (4, 3, 12)
    assert (b.batch_size, b.gamma, b.proposed) == (8, 0, 0)


def test_telemetry_is_a_valid_wire_message() -> None:
    w = SimWorker(Scenario(phases=[Phase(5, 4)], acceptance={"a": {"default": 0.7}, "b": {"default": 0.3}}))
    t = w.step(_choice(2, drafter="b"))
    assert codec.decode(codec.encode(t)) == t
    assert t.drafter == "b" and set(t.counterfactual) == {"a", "b"}
    assert t.step_time == pytest.approx(t.draft_time + t.verify_time + t.other_time)
    assert t.num_tokens == t.batch_size + t.accepted and t.ts == pytest.approx(w.clock)


def test_tokens_per_step_match_theory() -> None:
    alpha, gamma = 0.7, 4
    sc = Scenario(phases=[Phase(10, 16)], acceptance={"d": {"default": alpha}})
    w = SimWorker(sc, seed=3)
    per_seq = [t.num_tokens / t.batch_size for t in (w.step(_choice(gamma)) for _ in range(2000))]
    per_seq = per_seq[1:]  # the first step pays a catch-up but produces normally
    want = (1 - alpha ** (gamma + 1)) / (1 - alpha)
    assert np.mean(per_seq) == pytest.approx(want, rel=0.02)


def test_switching_on_pays_a_catch_up() -> None:
    sc = Scenario(phases=[Phase(100, 4)], noise=0.0)
    w = SimWorker(sc)
    for _ in range(10):
        assert not w.step(_choice(0)).switch_costs
    t = w.step(_choice(2))
    [event] = t.switch_costs
    assert event.tokens == 10 and event.batch_size == 4
    assert event.seconds == pytest.approx(sc.switch_scale * 10 * sc.curves.draft(4))
    assert not w.step(_choice(2)).switch_costs


def test_offload_grows_the_pool_and_forces_gamma_zero() -> None:
    sc = Scenario(phases=[Phase(100, 150)], kv_blocks=2048, draft_blocks=512, blocks_per_seq=16)
    w = SimWorker(sc)
    t = w.step(_choice(2))
    assert (t.batch_size, t.waiting, t.free_blocks, t.total_blocks) == (128, 22, 0, 2048)
    steps = [w.step(_choice(2, offload=True)) for _ in range(sc.offload_steps + 1)]
    assert all(s.gamma == 0 for s in steps)
    assert steps[-1].total_blocks == 2560 and steps[-1].batch_size == 150 and not steps[-1].draft_resident
    back = [w.step(_choice(2)) for _ in range(sc.reload_steps + 2)]
    assert all(s.gamma == 0 for s in back[: sc.reload_steps])  # reloading
    assert back[-1].gamma == 2 and back[-1].draft_resident and back[-1].total_blocks == 2048


def test_heartbeat_when_idle() -> None:
    w = SimWorker(Scenario(phases=[Phase(3, 0)]))
    t = w.step(_choice(2))
    assert t.batch_size == 0 and t.num_tokens == 0 and t.total_blocks > 0


def test_deterministic_for_a_seed() -> None:
    sc = Scenario(phases=[Phase(5, (1, 30), "x")], acceptance={"d": {"x": 0.6}})
    a = [SimWorker(sc, seed=5).step(_choice(2)) for _ in range(1)]
    b = [SimWorker(sc, seed=5).step(_choice(2)) for _ in range(1)]
    assert a == b
