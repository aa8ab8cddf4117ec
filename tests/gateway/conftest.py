"""Gateway tests: the app over httpx's ASGI transport on the embedded Redis, and a scripted
stand-in for the worker side that answers jobs with fixed events; for the outage tests, the
``mem`` fixture (the embedded store, whose server they cut off) and the helpers that play the
worker around an outage."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest
import redis.asyncio as aioredis

from gateway.app import create_app
from gateway.settings import GatewaySettings
from gateway.store import JobStore
from shared import codec, jobs, keys
from shared.batch_band import BatchBand
from shared.connection import connect, fake_server, reset_fake_server
from shared.control import WorkerInfo
from shared.schemas import FinishEvent, JobEvent, JobRequest, StartEvent, TokenEvent
from shared.streams import ensure_group, entries, id_str
from tests.conftest import flushed_redis
from tests.e2e.conftest import poll

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


# --- the embedded store cut off: shared by test_outage.py and test_dedup.py -----------------

TEXT = ["a", "b", "c", "d"]


@pytest.fixture
async def mem() -> AsyncIterator[aioredis.Redis]:
    """The embedded store, always (these tests cut its server off)."""
    reset_fake_server()
    client = connect("memory://")
    yield client
    fake_server().connected = True
    await client.aclose()


def redis_down() -> None:
    fake_server().connected = False


def redis_up() -> None:
    fake_server().connected = True


@asynccontextmanager
async def served(r: aioredis.Redis, **settings: Any) -> AsyncIterator[tuple[httpx.AsyncClient, JobStore]]:
    await register_worker(r)
    await ensure_group(r, keys.jobs_stream(MODEL), keys.JOBS_GROUP)
    app = create_app(GatewaySettings(**{"keepalive_s": 0.05, **settings}), redis=r)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as gw:
        yield gw, app.state.store


async def next_job(r: aioredis.Redis) -> JobRequest:
    """The next job submitted (as a worker takes it)."""

    async def taken() -> JobRequest | None:
        resp = await r.xreadgroup(keys.JOBS_GROUP, "w", {keys.jobs_stream(MODEL): ">"}, count=1)
        got = entries(resp)
        return codec.decode_as(got[0][1][codec.FIELD], JobRequest) if got else None

    job = await poll(taken, 10, "a job to be submitted")
    assert isinstance(job, JobRequest)
    return job


async def write(r: aioredis.Redis, events: list[JobEvent]) -> str:
    """Write a job's events as its worker would (the final one with the result); the last id."""
    async with r.pipeline(transaction=False) as pipe:
        final = events[-1] if isinstance(events[-1], FinishEvent) else None
        jobs.add_events(pipe, events[0].job_id, events[:-1] if final else events, model=MODEL)
        if final is not None:
            jobs.add_result(pipe, final, model=MODEL)
        await pipe.execute()
    last = await r.xrevrange(keys.job_events(MODEL, events[0].job_id), count=1)
    return id_str(last[0][0])


def start(job_id: str) -> StartEvent:
    return StartEvent(job_id=job_id, worker_id="w", prompt_tokens=1)


def token(job_id: str, i: int) -> TokenEvent:
    return TokenEvent(job_id=job_id, index=i, token_ids=[10 + i], text=TEXT[i])


def finish(job_id: str) -> FinishEvent:
    return FinishEvent(job_id=job_id, finish_reason="length", text="".join(TEXT), token_ids=[10, 11, 12, 13],
                       prompt_tokens=1, completion_tokens=4)  # fmt: skip


async def delivered(store: JobStore, job_id: str, entry_id: str) -> None:
    """Wait until the gateway's reader of the job's stream has read up to ``entry_id``."""

    async def read() -> bool:
        stream = keys.job_events(MODEL, job_id)
        return any(s.stream == stream and s.cursor == entry_id for s in store.hub._subs.get(MODEL, ()))

    await poll(read, 10, "the gateway to read the events before the outage")


async def outage_noticed(store: JobStore, readers: int = 1) -> None:
    async def noticed() -> bool:
        return store.outages.waiting >= readers

    await poll(noticed, 10, "the gateway's readers to notice the outage")


def sse_data(text: str) -> list[str]:
    return [line[6:] for line in text.split("\n") if line.startswith("data: ")]
