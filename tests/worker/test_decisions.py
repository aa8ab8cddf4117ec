from __future__ import annotations

import time

import pytest
import redis.asyncio as aioredis

from shared import codec, keys
from shared.control import Decision
from worker.decisions import DecisionFollower
from worker.engine.api import Engine, StepResult, StepStats
from worker.engine.spec.speculation_plan import SpeculationPlan

pytestmark = pytest.mark.anyio


class RecordingEngine(Engine):
    """Records the speculation plans applied; generates nothing."""

    def __init__(self) -> None:
        self.applied: list[SpeculationPlan] = []

    def add_request(self, request: object) -> None:  # type: ignore[override]
        raise NotImplementedError

    def abort_request(self, request_id: str) -> None:
        raise NotImplementedError

    def apply_plan(self, plan: SpeculationPlan) -> None:
        self.applied.append(plan)

    def step(self) -> StepResult:
        return StepResult([], StepStats())

    def has_unfinished(self) -> bool:
        return False


def _decision(version: int, created_at: float | None = None, valid_for_s: float = 30.0) -> Decision:
    return Decision(
        version=version,
        policy="static",
        gamma_table=[(1 << 30, 2)],
        created_at=created_at if created_at is not None else time.time(),
        valid_for_s=valid_for_s,
    )


async def _follower(r: aioredis.Redis) -> tuple[DecisionFollower, RecordingEngine]:
    engine = RecordingEngine()
    f = DecisionFollower(r, engine, "w1", check_s=1.0, block_ms=100)
    await f.start()
    return f, engine


async def test_no_decision_means_fallback(r: aioredis.Redis) -> None:
    f, engine = await _follower(r)
    assert f.fallback and f.version == 0
    assert engine.applied[-1].version == 0 and engine.applied[-1].gamma_for(1) == 0
    assert not engine.applied[-1].offload  # draft stays resident
    assert await r.hget(keys.DECISION_ACKS, "w1") == b"0"


async def test_fresh_latest_is_applied_and_acked(r: aioredis.Redis) -> None:
    await r.set(keys.DECISION_LATEST, codec.encode(_decision(4)))
    f, engine = await _follower(r)
    assert not f.fallback and f.version == 4 and engine.applied[-1].version == 4
    assert await r.hget(keys.DECISION_ACKS, "w1") == b"4"


async def test_stale_latest_falls_back_then_a_fresh_one_is_followed(r: aioredis.Redis) -> None:
    await r.set(keys.DECISION_LATEST, codec.encode(_decision(4, created_at=time.time() - 100)))
    f, engine = await _follower(r)
    assert f.fallback and engine.applied[-1].version == 0
    assert await f.offer(_decision(5))
    assert not f.fallback and f.version == 5
    assert not await f.offer(_decision(5)) and not await f.offer(_decision(3))  # old news


async def test_decision_going_stale_triggers_fallback(r: aioredis.Redis) -> None:
    f, engine = await _follower(r)
    d = _decision(2, created_at=1000.0, valid_for_s=10)
    assert await f.offer(d, now=1001.0)
    await f.check(now=1005.0)
    assert not f.fallback
    await f.check(now=1011.0)
    assert f.fallback and engine.applied[-1].version == 0
    assert await r.hget(keys.DECISION_ACKS, "w1") == b"0"
