from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from shared import codec, keys
from shared.control import MemoryEvent, SwitchCostEvent, Telemetry
from shared.schemas import JobRequest
from shared.streams import ensure_group
from worker.engine.api import StepStats
from worker.telemetry import TelemetryPublisher

pytestmark = pytest.mark.anyio
M = "tiny"  # the served model name of these tests' workers


async def test_step_telemetry_carries_queue_depth_and_decision(r: aioredis.Redis) -> None:
    await ensure_group(r, keys.jobs_stream(M), keys.JOBS_GROUP)
    for i in range(3):
        await r.xadd(keys.jobs_stream(M), codec.entry(JobRequest(job_id=f"j{i}", prompt="x")))
    pub = TelemetryPublisher(r, "w1", lag_refresh_s=0.0, model=M)
    stats = StepStats(step=9, batch_size=2, num_tokens=2, waiting=4, step_time=0.01, running=2)
    sent = await pub.publish(stats, decision_version=7, fallback=True)
    ((_, fields),) = await r.xrange(keys.TELEMETRY_STREAM)
    got = codec.from_entry(fields)
    assert isinstance(got, Telemetry) and got == sent
    assert got.queue_depth == 4 + 3 and got.batch_size == 2 and got.step == 9
    assert got.decision_version == 7 and got.fallback and got.worker_id == "w1"


async def test_idle_heartbeat_is_a_zero_batch_step(r: aioredis.Redis) -> None:
    pub = TelemetryPublisher(r, "w1", lag_refresh_s=60.0, model=M)
    t = await pub.publish(StepStats(), decision_version=0, fallback=False)
    assert t.batch_size == 0 and t.queue_depth == 0


async def test_every_step_stat_reaches_the_planner(r: aioredis.Redis) -> None:
    """Each StepStats field has a Telemetry field of the same name, and its value arrives."""
    stats = StepStats(
        step=3, batch_size=4, prefill_tokens=5, num_tokens=9, gamma=2, drafter="nj-draft-prose",
        step_time=0.5, draft_time=0.1, verify_time=0.3, other_time=0.1, counterfactual_time=0.02,
        proposed=8, accepted=5, counterfactual={"nj-draft-prose": 0.6, "ngram": 0.25}, mean_context=40.0,
        running=4, waiting=1, free_blocks=7, total_blocks=90, draft_resident=False,
        switch_costs=[SwitchCostEvent(drafter="ngram", batch_size=4, tokens=12, seconds=0.01, input_len=50)],
        prefix_queries=10, prefix_hits=6, preempted=1,
        memory_events=[MemoryEvent(kind="offload", seconds=0.2, bytes=1024, from_blocks=9, to_blocks=20)],
        failed=1,
    )  # fmt: skip
    sent = await TelemetryPublisher(r, "w1", lag_refresh_s=60.0, model=M).publish(
        stats, decision_version=4, fallback=False
    )
    assert issubclass(Telemetry, StepStats)  # one list of fields: Telemetry is a StepStats
    for name in StepStats.model_fields:
        if name not in ("decision_version", "fallback"):  # the service's own view wins
            assert getattr(sent, name) == getattr(stats, name), name
    ((_, fields),) = await r.xrange(keys.TELEMETRY_STREAM)
    assert codec.from_entry(fields) == sent
