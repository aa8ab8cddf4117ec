from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from shared import codec, keys
from shared.schemas import JobRequest, Telemetry
from shared.streams import ensure_group
from worker.engine.api import StepStats
from worker.telemetry import TelemetryPublisher

pytestmark = pytest.mark.anyio


async def test_step_telemetry_carries_queue_depth_and_decision(r: aioredis.Redis) -> None:
    await ensure_group(r, keys.JOBS_STREAM, keys.JOBS_GROUP)
    for i in range(3):
        await r.xadd(keys.JOBS_STREAM, codec.entry(JobRequest(job_id=f"j{i}", prompt="x")))
    pub = TelemetryPublisher(r, "w1", lag_refresh_s=0.0)
    stats = StepStats(step=9, batch_size=2, num_tokens=2, waiting=4, step_time=0.01, running=2)
    sent = await pub.publish(stats, decision_version=7, fallback=True)
    ((_, fields),) = await r.xrange(keys.TELEMETRY_STREAM)
    got = codec.from_entry(fields)
    assert isinstance(got, Telemetry) and got == sent
    assert got.queue_depth == 4 + 3 and got.batch_size == 2 and got.step == 9
    assert got.decision_version == 7 and got.fallback and got.worker_id == "w1"


async def test_idle_heartbeat_is_a_zero_batch_step(r: aioredis.Redis) -> None:
    pub = TelemetryPublisher(r, "w1", lag_refresh_s=60.0)
    t = await pub.publish(StepStats(), decision_version=0, fallback=False)
    assert t.batch_size == 0 and t.queue_depth == 0
