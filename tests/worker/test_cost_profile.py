"""The worker's cost profile: published under its model's key, skipped by the flag, measured
again after a pool change."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
import redis.asyncio as aioredis

from shared import codec, jobs, keys
from shared.control import MemoryEvent, StepStats
from shared.profile import CostProfile
from shared.schemas import JobRequest, SamplingParams
from worker.cost_profile import CostProfiler
from worker.engine.api import Engine
from worker.profiling import ProfileSettings
from worker.prompts import PromptEncoder
from worker.service import WorkerService
from worker.settings import WorkerSettings

pytestmark = pytest.mark.anyio
M = "tiny"
FAST = ProfileSettings(max_batch=2, reps=1)


async def _published(r: aioredis.Redis) -> CostProfile | None:
    raw = await r.get(keys.cost_profile(M))
    return None if raw is None else CostProfile.loads(raw)


async def _serve_one(r: aioredis.Redis, w: WorkerService) -> None:
    job = JobRequest(job_id="j1", prompt="Once upon", params=SamplingParams(max_tokens=4))
    await r.hset(keys.job_key(M, job.job_id), mapping={jobs.STATUS: "queued"})
    await r.xadd(keys.jobs_stream(M), codec.entry(job))
    with anyio.fail_after(120):
        await w.run(burst=True)
    assert await r.hget(keys.job_key(M, "j1"), jobs.STATUS) == b"finished"


@pytest.mark.parametrize("enabled", [True, False])
async def test_worker_publishes_its_profile_unless_told_not_to(
    r: aioredis.Redis, model_dir: Path, engine: Engine, prompts: PromptEncoder, enabled: bool
) -> None:
    settings = WorkerSettings(
        model_dir=str(model_dir), worker_id="w1", model_name=M, profile=enabled, profile_shape=FAST
    )
    w = WorkerService(settings, engine=engine, prompts=prompts, redis=r)
    await _serve_one(r, w)
    published = await _published(r)
    if enabled:
        assert published is not None and published.model == M and published.worker_id == "w1"
        assert published.batches == [1, 2] and published.source == "startup"
    else:
        assert published is None and w.profiler.profile is None


async def test_a_stop_during_the_startup_profile_ends_the_run_before_it_serves(
    r: aioredis.Redis, model_dir: Path, engine: Engine, prompts: PromptEncoder
) -> None:
    """SIGTERM while the profile runs (a minute on SmolLM2): ``run`` returns within a step,
    without registering or taking a job."""
    endless = ProfileSettings(max_batch=2)
    settings = WorkerSettings(
        model_dir=str(model_dir), worker_id="w1", model_name=M, profile=True, profile_shape=endless,
        profile_reps=1000, profile_budget_s=3600, profile_cache=False,
    )  # fmt: skip
    w = WorkerService(settings, engine=engine, prompts=prompts, redis=r)
    step = engine.step
    stepped = anyio.Event()

    def step_and_tell():  # type: ignore[no-untyped-def]
        result = step()
        anyio.from_thread.run_sync(stepped.set)
        return result

    engine.step = step_and_tell  # type: ignore[method-assign]
    with anyio.fail_after(60):  # a deadlock guard, not a timing: the pass alone would take an hour
        async with anyio.create_task_group() as tg:
            tg.start_soon(w.run)
            await stepped.wait()  # the profile is measuring
            w.request_stop()
    engine.step = step  # type: ignore[method-assign]
    for _ in range(4):  # the decision restored after the pass is applied at the next step
        engine.step()
    assert not engine.has_unfinished() and w.profiler.profile is None
    assert await r.hget(keys.WORKERS, "w1") is None  # it never registered


async def test_default_settings_do_not_profile(model_dir: Path) -> None:
    assert not WorkerSettings(model_dir=str(model_dir)).profiling().enabled


async def test_measured_again_after_a_pool_change(r: aioredis.Redis, engine: Engine) -> None:
    profiler = CostProfiler(r, engine, M, "w1", FAST)
    assert await profiler.measure() is None
    await profiler.publish()
    first = await _published(r)
    assert first is not None
    assert await profiler.when_idle() is None and profiler.profile is not None
    assert profiler.profile.measured_at == first.measured_at  # nothing changed: not measured again
    profiler.note(StepStats(memory_events=[MemoryEvent(kind="kv_resize", seconds=0.0, to_blocks=256)]))
    assert profiler.stale
    assert await profiler.when_idle() is None and not profiler.stale
    await profiler.publish()
    second = await _published(r)
    assert second is not None and second.source == "after a pool change"
    assert second.measured_at > first.measured_at
