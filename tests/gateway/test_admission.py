"""Admission: an atomic queue limit, Retry-After, readiness, no worker, the model's context."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import anyio
import pytest
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from shared import codec, keys
from shared.control import Decision
from shared.streams import entries
from tests.conftest import flushed_redis
from tests.gateway.conftest import MODEL, gateway, register_worker, scripted_worker

pytestmark = pytest.mark.anyio

REAL_REDIS_URL = "redis://127.0.0.1:6379/11"  # a db of these tests' own, flushed around each


@pytest.fixture
async def real_r() -> AsyncIterator[aioredis.Redis]:
    async with flushed_redis(REAL_REDIS_URL) as client:
        yield client


async def _flood(r: aioredis.Redis, n: int, max_queue: int) -> list[int]:
    codes: list[int] = []
    async with gateway(r, max_queue=max_queue) as gw:

        async def one(i: int) -> None:
            resp = await gw.post("/v1/jobs", json={"prompt": f"p{i}"})
            if resp.status_code == 429:
                assert resp.headers["Retry-After"] == "1"
                assert resp.json()["error"]["code"] == "queue_full"
            codes.append(resp.status_code)

        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(one, i)
    return codes


async def test_the_queue_limit_holds_under_concurrency(r: aioredis.Redis) -> None:
    codes = await _flood(r, 50, 5)
    assert codes.count(202) == 5 and codes.count(429) == 45
    assert await r.xlen(keys.jobs_stream(MODEL)) == 5


@pytest.mark.redis
async def test_the_queue_limit_holds_under_concurrency_on_redis(real_r: aioredis.Redis) -> None:
    codes = await _flood(real_r, 50, 5)
    assert codes.count(202) == 5 and codes.count(429) == 45
    assert await real_r.xlen(keys.jobs_stream(MODEL)) == 5


@pytest.mark.redis
async def test_jobs_run_and_count_on_redis(real_r: aioredis.Redis) -> None:
    async with gateway(real_r, max_queue=2) as gw, scripted_worker(real_r):
        for _ in range(4):  # finished jobs leave the count: the limit is on jobs in flight
            resp = await gw.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
            assert resp.status_code == 200 and resp.json()["choices"][0]["text"] == "Hello"


async def test_the_limit_counts_deleted_and_undelivered_entries(r: aioredis.Redis) -> None:
    async with gateway(r, max_queue=3) as gw:
        ids = [(await gw.post("/v1/jobs", json={"prompt": "x"})).json()["id"] for _ in range(3)]
        assert (await gw.post("/v1/jobs", json={"prompt": "x"})).status_code == 429
        # An undelivered entry deleted from the stream makes Redis report lag as unknown.
        newest = (await r.xrevrange(keys.jobs_stream(MODEL), count=1))[0][0]
        await r.xdel(keys.jobs_stream(MODEL), newest)
        assert (await gw.post("/v1/jobs", json={"prompt": "x"})).status_code == 202
        assert (await gw.post("/v1/jobs", json={"prompt": "x"})).status_code == 429
    assert len(ids) == 3


async def test_no_live_worker_is_a_503_with_retry_after(r: aioredis.Redis) -> None:
    async with gateway(r, worker=False) as gw:
        for route, body in (
            ("/v1/jobs", {"prompt": "x"}),
            ("/v1/completions", {"prompt": "x"}),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
        ):
            resp = await gw.post(route, json=body)
            assert resp.status_code == 503 and int(resp.headers["Retry-After"]) >= 1
            assert resp.json()["error"]["code"] == "unavailable"
        await register_worker(r, "gone", age_s=600)  # its heartbeat stopped long ago
        await register_worker(r, "leaving", draining=True)
        assert (await gw.post("/v1/jobs", json={"prompt": "x"})).status_code == 503
    assert await r.xlen(keys.jobs_stream(MODEL)) == 0
    async with gateway(r, worker=False, require_worker=False) as gw:  # opted out: jobs wait
        assert (await gw.post("/v1/jobs", json={"prompt": "x"})).status_code == 202


async def test_liveness_and_readiness(r: aioredis.Redis) -> None:
    async with gateway(r, worker=False) as gw:
        assert (await gw.get("/health/live")).json() == {"status": "ok"}
        assert (await gw.get("/health")).status_code == 200
        not_ready = await gw.get("/health/ready")
        assert not_ready.status_code == 503 and not_ready.headers["Retry-After"] == "5"
        assert not_ready.json()["status"] == "not_ready" and not_ready.json()["workers"] == 0
        await register_worker(r, "leaving", draining=True)
        assert (await gw.get("/health/ready")).json()["draining"] == 1
        await register_worker(r, "w1")
        decision = Decision(version=7, policy="static", created_at=time.time() - 100, valid_for_s=30)
        await r.set(keys.DECISION_LATEST, codec.encode(decision))
        ready = await gw.get("/health/ready")
    body = ready.json()
    assert ready.status_code == 200 and body["status"] == "ready" and body["workers"] == 1
    assert body["planner"]["decision_version"] == 7 and body["planner"]["stale"] is True
    assert 99 <= body["planner"]["decision_age_s"] < 200


async def test_health_without_redis_is_still_alive() -> None:
    down = aioredis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))
    async with gateway(down, worker=False) as gw:
        health = await gw.get("/health")
        live = await gw.get("/health/live")
        ready = await gw.get("/health/ready")
    assert health.status_code == 200 and health.json() == {"status": "ok", "store": "unavailable"}
    assert live.status_code == 200
    assert ready.status_code == 503 and "Redis" in ready.json()["reason"]
    await down.aclose()


CONTEXT_MSG = (
    "This model's maximum context length is 100 tokens. However, you requested {m} tokens "
    "({p} in the messages, {c} in the completion). Please reduce the length of the messages or completion."
)


async def test_context_length_is_checked_before_enqueueing(r: aioredis.Redis) -> None:
    async with gateway(r, worker=False) as gw:
        await register_worker(r, "small", max_model_len=100)
        await register_worker(r, "big", max_model_len=4096)  # the smallest context decides
        over = await gw.post("/v1/completions", json={"prompt": "x", "max_tokens": 101})
        ids = await gw.post("/v1/completions", json={"prompt": list(range(1, 61)), "max_tokens": 41})
        chat = await gw.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 200}
        )
        job = await gw.post("/v1/jobs", json={"prompt_token_ids": [1] * 90, "params": {"max_tokens": 11}})
        assert await r.xlen(keys.jobs_stream(MODEL)) == 0
        # Not given: lowered to fit (chat's default is 256 here), not refused.
        fits = await gw.post("/v1/jobs", json={"prompt_token_ids": [1] * 90})
    for resp, m, p, c in ((over, 101, 0, 101), (ids, 101, 60, 41), (chat, 200, 0, 200), (job, 101, 90, 11)):
        assert resp.status_code == 400, resp.text
        err = resp.json()["error"]
        assert err["code"] == "context_length_exceeded" and err["type"] == "invalid_request_error"
        assert err["message"] == CONTEXT_MSG.format(m=m, p=p, c=c)
    assert fits.status_code == 202
    ((_, fields),) = await r.xrange(keys.jobs_stream(MODEL))
    assert codec.decode(fields[codec.FIELD]).params.max_tokens == 10  # type: ignore[attr-defined]


async def test_answered_entries_deleted_by_workers_free_their_places(r: aioredis.Redis) -> None:
    async with gateway(r, max_queue=3) as gw:
        for _ in range(3):
            assert (await gw.post("/v1/jobs", json={"prompt": "x"})).status_code == 202
        got = entries(await r.xreadgroup(keys.JOBS_GROUP, "w", {keys.jobs_stream(MODEL): ">"}, count=2))
        assert (await gw.post("/v1/jobs", json={"prompt": "x"})).status_code == 429  # 2 running + 1 waiting
        for entry_id, _ in got:  # answered: acknowledged and deleted, as a worker does
            await r.xack(keys.jobs_stream(MODEL), keys.JOBS_GROUP, entry_id)
            await r.xdel(keys.jobs_stream(MODEL), entry_id)
        codes = [(await gw.post("/v1/jobs", json={"prompt": "x"})).status_code for _ in range(3)]
    assert codes == [202, 202, 429]
