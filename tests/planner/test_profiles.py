"""The planner reads the workers' published cost profiles and hands them to its policy."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis.asyncio as aioredis

from planner.policies import registry
from planner.policies.base import Choice, Policy
from planner.policies.nightjar import NightjarPolicy
from planner.profiles import newest_profile
from planner.service import PlannerService
from planner.settings import PlannerSettings
from shared import codec, keys
from shared.control import ALL_BATCHES, PolicyCommand, Telemetry, WorkerInfo
from shared.profile import CostProfile

pytestmark = pytest.mark.anyio


class Recording(Policy):
    """Test policy: keeps every profile it is handed."""

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.profiles: list[CostProfile] = []

    def observe(self, t: Telemetry) -> None:
        """Learns nothing."""

    def decide(self, now: float) -> Choice:
        return Choice(gamma_table=[(ALL_BATCHES, 0)])

    def use_profile(self, profile: CostProfile) -> None:
        self.profiles.append(profile)


def factory(name: str, **params: Any) -> Policy:
    return Recording(**params) if name == "recording" else registry.create(name, **params)


def _profile(model: str, worker: str, measured_at: float) -> CostProfile:
    return CostProfile(
        model=model, batches=[1, 8], rows=[1, 2], target_s=[[0.01, 0.012], [0.02, 0.03]],
        drafter_s={"d": [0.001, 0.002]}, worker_id=worker, measured_at=measured_at,
    )  # fmt: skip


async def _worker(r: aioredis.Redis, worker: str, model: str, ts: float | None = None) -> None:
    info = WorkerInfo(worker_id=worker, model=model, ts=time.time() if ts is None else ts)
    await r.hset(keys.WORKERS, worker, codec.encode(info))


async def test_newest_profile_of_the_live_workers(r: aioredis.Redis) -> None:
    assert await newest_profile(r) is None
    await _worker(r, "w1", "m1")
    await _worker(r, "w2", "m2")
    await _worker(r, "gone", "m3", ts=time.time() - 3600)
    await r.set(keys.cost_profile("m1"), _profile("m1", "w1", 100.0).dumps())
    await r.set(keys.cost_profile("m2"), _profile("m2", "w2", 200.0).dumps())
    await r.set(keys.cost_profile("m3"), _profile("m3", "gone", 300.0).dumps())  # no live worker
    newest = await newest_profile(r)
    assert newest is not None and (newest.model, newest.measured_at) == ("m2", 200.0)
    await r.set(keys.cost_profile("m2"), b"{not json")  # unreadable: ignored
    newest = await newest_profile(r)
    assert newest is not None and newest.model == "m1"


async def test_planner_hands_each_new_profile_to_the_policy(r: aioredis.Redis) -> None:
    await _worker(r, "w1", "m1")
    await r.set(keys.cost_profile("m1"), _profile("m1", "w1", 100.0).dumps())
    planner = PlannerService(PlannerSettings(policy="recording"), redis=r, factory=factory)
    await planner.start()
    policy = planner.slot.policy
    assert isinstance(policy, Recording) and [p.measured_at for p in policy.profiles] == [100.0]
    await planner.read_profile()  # the same measurement: not handed again
    assert len(policy.profiles) == 1
    await r.set(keys.cost_profile("m1"), _profile("m1", "w1", 150.0).dumps())  # measured again
    await planner.read_profile()
    assert [p.measured_at for p in policy.profiles] == [100.0, 150.0]
    await planner.apply(PolicyCommand(policy="nightjar"))  # a policy swapped in gets it too
    nightjar = planner.slot.policy
    assert isinstance(nightjar, NightjarPolicy) and nightjar.profile is not None
    assert nightjar.profile.measured_at == 150.0


async def test_until_it_has_a_profile_the_planner_looks_often(r: aioredis.Redis) -> None:
    """A worker publishes its profile as it starts taking jobs; a planner that has none looks
    every PROFILE_WAIT_S, not every profile_check_s, so the policy gets its prior at once."""
    import anyio

    from planner.service import PROFILE_WAIT_S

    settings = PlannerSettings(policy="recording", profile_check_s=60.0)
    planner = PlannerService(settings, redis=r, factory=factory)
    await planner.start()
    policy = planner.slot.policy
    assert isinstance(policy, Recording) and policy.profiles == []
    async with anyio.create_task_group() as tg:
        tg.start_soon(planner._watch_profile)
        await _worker(r, "w1", "m1")
        await r.set(keys.cost_profile("m1"), _profile("m1", "w1", 100.0).dumps())
        with anyio.fail_after(10 * PROFILE_WAIT_S + 2.0):
            while not policy.profiles:
                await anyio.sleep(0.02)
        tg.cancel_scope.cancel()
    assert [p.measured_at for p in policy.profiles] == [100.0]
