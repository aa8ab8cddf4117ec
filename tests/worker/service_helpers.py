"""The worker service tests' helpers: a worker over the embedded Redis, a job enqueued as the
gateway would, a job's events, a burst-mode drain, the stream's pending count."""

from __future__ import annotations

from pathlib import Path

import anyio
import redis.asyncio as aioredis

from shared import codec, jobs, keys
from shared.schemas import JobRequest, Message
from worker.engine.api import Engine
from worker.prompts import PromptEncoder
from worker.service import WorkerService
from worker.settings import WorkerSettings

M = "tiny"  # the served model name of these tests' workers


def make_worker(
    r: aioredis.Redis, model_dir: Path, engine: Engine, prompts: PromptEncoder, **kw: object
) -> WorkerService:
    kw.setdefault("worker_id", "w1")
    kw.setdefault("model_name", M)
    settings = WorkerSettings(model_dir=str(model_dir), **kw)  # type: ignore[arg-type]
    return WorkerService(settings, engine=engine, prompts=prompts, redis=r)


async def enqueue(r: aioredis.Redis, job: JobRequest) -> None:
    await r.hset(keys.job_key(M, job.job_id), mapping={jobs.STATUS: "queued"})
    await r.xadd(keys.jobs_stream(M), codec.entry(job))


async def read_events(r: aioredis.Redis, job_id: str) -> list[Message]:
    return [codec.from_entry(f) for _, f in await r.xrange(keys.job_events(M, job_id))]


async def drain(w: WorkerService) -> None:
    with anyio.fail_after(120):
        await w.run(burst=True)


async def pending_count(r: aioredis.Redis) -> int:
    return len(await r.xpending_range(keys.jobs_stream(M), keys.JOBS_GROUP, "-", "+", 100))
