"""Gateway tests: the app over httpx's ASGI transport on the embedded Redis, and a scripted
stand-in for the worker side that answers jobs with fixed events."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
import httpx
import pytest
import redis.asyncio as aioredis

from gateway.app import create_app
from gateway.settings import GatewaySettings
from shared import codec, jobs, keys
from shared.batch_band import BatchBand
from shared.control import WorkerInfo
from shared.schemas import FinishEvent, JobEvent, JobRequest, StartEvent, TokenEvent
from shared.streams import ensure_group, entries
from tests.conftest import flushed_redis

Script = Callable[[JobRequest], list[JobEvent]]
MODEL = "fake-model"  # what register_worker's worker serves

# NIGHTJAR_GATEWAY_TEST_REDIS=redis://127.0.0.1:6379/11 runs every gateway test on that real
# Redis database (flushed before and after each test) instead of the embedded store.
REAL_REDIS = os.environ.get("NIGHTJAR_GATEWAY_TEST_REDIS")

if REAL_REDIS:

    @pytest.fixture
    async def r() -> AsyncIterator[aioredis.Redis]:
        async with flushed_redis(REAL_REDIS) as client:
            yield client


async def register_worker(
    r: aioredis.Redis,
    worker_id: str = "fake",
    *,
    max_model_len: int = 0,
    draining: bool = False,
    age_s: float = -3600.0,
    model: str = MODEL,
) -> None:
    """A worker registration as a heartbeat writes it; by default stamped an hour ahead so
    it stays live for the whole test without heartbeats."""
    info = WorkerInfo(
        worker_id=worker_id,
        model=model,
        ts=time.time() - age_s,
        max_model_len=max_model_len,
        draining=draining,
    )
    await r.hset(keys.WORKERS, worker_id, codec.encode(info))


@asynccontextmanager
async def gateway(
    r: aioredis.Redis, *, worker: bool = True, **settings: object
) -> AsyncIterator[httpx.AsyncClient]:
    """The app on ``r``; with ``worker`` a live worker is registered so submits are admitted."""
    if worker:
        await register_worker(r)
    app = create_app(GatewaySettings(**settings), redis=r)  # type: ignore[arg-type]
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        yield client


def hello(job: JobRequest) -> list[JobEvent]:
    """Answers every job with "Hello" in two token events."""
    return [
        StartEvent(job_id=job.job_id, worker_id="fake", prompt_tokens=3),
        TokenEvent(job_id=job.job_id, index=0, token_ids=[7], text="Hel"),
        TokenEvent(job_id=job.job_id, index=1, token_ids=[8], text="lo"),
        FinishEvent(
            job_id=job.job_id,
            finish_reason="length",
            text="Hello",
            token_ids=[7, 8],
            prompt_tokens=3,
            completion_tokens=2,
        ),
    ]


@asynccontextmanager
async def scripted_worker(
    r: aioredis.Redis, script: Script = hello, model: str = MODEL
) -> AsyncIterator[list[JobRequest]]:
    """Consume the model's job stream like a worker would, answering with ``script``;
    yields the jobs seen."""
    seen: list[JobRequest] = []
    stream = keys.jobs_stream(model)
    await ensure_group(r, stream, keys.JOBS_GROUP)

    band = BatchBand(r, model)

    async def serve() -> None:
        while True:
            resp = await r.xreadgroup(keys.JOBS_GROUP, "fake", {stream: ">"}, count=10)
            if not entries(resp) and await band.promote(10):  # batch jobs when nothing live waits
                resp = await r.xreadgroup(keys.JOBS_GROUP, "fake", {stream: ">"}, count=10)
            if not entries(resp):
                resp = await r.xreadgroup(keys.JOBS_GROUP, "fake", {stream: ">"}, count=10, block=50)
            for entry_id, fields in entries(resp):
                job = codec.decode_as(fields[codec.FIELD], JobRequest)
                seen.append(job)
                *events, final = script(job)
                async with r.pipeline(transaction=False) as pipe:
                    jobs.add_events(pipe, job.job_id, events, model=model)
                    jobs.add_result(pipe, final, model=model)  # type: ignore[arg-type]
                    pipe.xack(stream, keys.JOBS_GROUP, entry_id)
                    await pipe.execute()

    async with anyio.create_task_group() as tg:
        tg.start_soon(serve)
        yield seen
        tg.cancel_scope.cancel()
