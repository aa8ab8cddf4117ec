"""Requests in flight ride out a Redis outage shorter than the grace period; past it they are
answered 503 (or an error chunk) and their job is cancelled once Redis is back.

On the embedded store, whose server can be cut off (``FakeServer.connected``): every command
of every client then fails with a ConnectionError, as when a real Redis goes away. The test
plays the worker, writing the job's events before and after the outage; the real-process
version (a redis-server killed for 5 s under 6 + 6 OpenAI clients) is in tests/chaos.
"""

from __future__ import annotations

import json

import anyio
import httpx
import pytest
import redis.asyncio as aioredis

from shared import codec, keys
from tests.e2e.conftest import poll
from tests.gateway.conftest import (
    MODEL,
    TEXT,
    delivered,
    finish,
    next_job,
    outage_noticed,
    redis_down,
    redis_up,
    served,
    sse_data,
    start,
    token,
    write,
)

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("stream", [True, False])
async def test_a_completion_rides_out_an_outage_and_gets_every_token_once(
    mem: aioredis.Redis, stream: bool
) -> None:
    got: dict[str, httpx.Response] = {}
    async with served(mem) as (gw, store):
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:

                async def client() -> None:
                    body = {"prompt": "x", "max_tokens": 4, "stream": stream}
                    got["resp"] = await gw.post("/v1/completions", json=body)

                tg.start_soon(client)
                job = await next_job(mem)
                j = job.job_id
                last = await write(mem, [start(j), token(j, 0), token(j, 1)])
                if stream:  # (a non-streaming reader waits for the final event only)
                    await delivered(store, j, last)
                redis_down()
                await outage_noticed(store)
                redis_up()  # the worker's writes land once Redis is back
                await write(mem, [token(j, 2), token(j, 3), finish(j)])
    resp = got["resp"]
    assert resp.status_code == 200, resp.text
    if stream:
        data = sse_data(resp.text)
        assert data[-1] == "[DONE]"
        chunks = [json.loads(d) for d in data[:-1]]
        assert not any("error" in c for c in chunks), chunks
        assert "".join(c["choices"][0]["text"] for c in chunks) == "".join(TEXT)  # each token once
    else:
        assert resp.json()["choices"][0]["text"] == "".join(TEXT)
    assert store.outages.resumed >= 1 and store.outages.gave_up == 0 and store.outages.waiting == 0
    assert await mem.get(keys.job_cancel(MODEL, j)) is None  # answered: nothing cancelled


async def test_several_choices_ride_out_an_outage(mem: aioredis.Redis) -> None:
    got: dict[str, httpx.Response] = {}
    async with served(mem) as (gw, store):
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:

                async def client() -> None:
                    body = {"prompt": "x", "max_tokens": 4, "n": 2, "stream": True}
                    got["resp"] = await gw.post("/v1/completions", json=body)

                tg.start_soon(client)
                choices = sorted([await next_job(mem), await next_job(mem)], key=lambda job: job.job_id)
                for job in choices:
                    await write(mem, [start(job.job_id), token(job.job_id, 0)])
                redis_down()
                await outage_noticed(store)
                redis_up()
                for job in choices:
                    j = job.job_id
                    await write(mem, [token(j, 1), token(j, 2), token(j, 3), finish(j)])
    data = sse_data(got["resp"].text)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert not any("error" in c for c in chunks), chunks
    for index in (0, 1):
        text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"][0]["index"] == index)
        assert text == "".join(TEXT)


async def test_the_job_api_event_stream_resumes_after_an_outage(mem: aioredis.Redis) -> None:
    async with served(mem) as (gw, store):
        job_id = (await gw.post("/v1/jobs", json={"prompt": "x"})).json()["id"]
        await next_job(mem)
        got: dict[str, httpx.Response] = {}
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:

                async def client() -> None:
                    got["resp"] = await gw.get(f"/v1/jobs/{job_id}/events")

                tg.start_soon(client)
                last = await write(mem, [start(job_id), token(job_id, 0)])
                await delivered(store, job_id, last)
                redis_down()
                await outage_noticed(store)
                redis_up()
                await write(mem, [token(job_id, 1), token(job_id, 2), token(job_id, 3), finish(job_id)])
    text = got["resp"].text
    ids = [line[4:] for line in text.split("\n") if line.startswith("id: ")]
    kinds = [line[7:] for line in text.split("\n") if line.startswith("event: ")]
    assert kinds == ["start", "token", "token", "token", "token", "finish"]  # no error, none twice
    assert ids == sorted(set(ids), key=lambda i: tuple(map(int, i.split("-"))))


async def test_past_the_grace_period_a_completion_is_a_503_and_its_job_is_cancelled_once_redis_is_back(
    mem: aioredis.Redis,
) -> None:
    async with served(mem, outage_grace_s=0.3) as (gw, store):
        got: dict[str, httpx.Response] = {}
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:

                async def client() -> None:
                    got["resp"] = await gw.post("/v1/completions", json={"prompt": "x", "max_tokens": 4})

                tg.start_soon(client)
                job = await next_job(mem)
                await write(mem, [start(job.job_id), token(job.job_id, 0)])
                redis_down()
            resp = got["resp"]  # answered while Redis is still down
            assert resp.status_code == 503 and resp.headers["retry-after"]
            assert resp.json()["error"]["code"] == "unavailable"
            assert job.job_id in store.cancels and store.outages.gave_up == 1
            redis_up()

            async def cancelled() -> bool:
                return await mem.get(keys.job_cancel(MODEL, job.job_id)) == b"1"

            await poll(cancelled, 10, "the remembered cancel to be written")
    broadcast = [codec.from_entry(f) for _, f in await mem.xrange(keys.cancel_stream(MODEL))]
    assert [c.job_id for c in broadcast] == [job.job_id]  # type: ignore[attr-defined]
    assert len(store.cancels) == 0


async def test_past_the_grace_period_a_stream_ends_with_an_error_chunk_and_its_job_is_cancelled(
    mem: aioredis.Redis,
) -> None:
    # Keep-alives far apart: between reading the first events and passing them on, the reader
    # makes no Redis call that the outage could fail (else they are read again after it).
    async with served(mem, outage_grace_s=0.3, keepalive_s=3) as (gw, store):
        got: dict[str, httpx.Response] = {}
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:

                async def client() -> None:
                    body = {"prompt": "x", "max_tokens": 4, "stream": True}
                    got["resp"] = await gw.post("/v1/completions", json=body)

                tg.start_soon(client)
                job = await next_job(mem)
                last = await write(mem, [start(job.job_id), token(job.job_id, 0)])
                await delivered(store, job.job_id, last)
                redis_down()
            data = sse_data(got["resp"].text)
            assert got["resp"].status_code == 200 and data[-1] == "[DONE]"
            assert json.loads(data[0])["choices"][0]["text"] == TEXT[0]
            assert json.loads(data[-2])["error"]["code"] == "unavailable"
            assert job.job_id in store.cancels
            redis_up()

            async def cancelled() -> bool:
                return await mem.get(keys.job_cancel(MODEL, job.job_id)) == b"1"

            await poll(cancelled, 10, "the remembered cancel to be written")


async def test_a_submission_during_an_outage_is_a_503_with_retry_after_at_once(mem: aioredis.Redis) -> None:
    async with served(mem, outage_grace_s=30) as (gw, store):
        redis_down()
        with anyio.fail_after(5):  # not the 30 s grace: nothing was accepted, nothing waits
            for body in ({"prompt": "x"}, {"prompt": "x", "stream": True}):
                resp = await gw.post("/v1/completions", json=body)
                assert resp.status_code == 503 and resp.headers["retry-after"]
                assert resp.json()["error"]["code"] == "unavailable"
            resp = await gw.post("/v1/jobs", json={"prompt": "x"})
            assert resp.status_code == 503 and resp.headers["retry-after"]
        redis_up()
    assert store.outages.waiting == 0 and len(store.cancels) == 0


async def test_a_cancel_that_meets_an_outage_is_written_once_redis_is_back(mem: aioredis.Redis) -> None:
    async with served(mem) as (gw, store):
        job_id = (await gw.post("/v1/jobs", json={"prompt": "x"})).json()["id"]
        redis_down()
        with anyio.fail_after(10):
            await store.cancel_soon(job_id)  # (a client that left while Redis was down)
        assert job_id in store.cancels
        redis_up()

        async def written() -> bool:
            return await mem.get(keys.job_cancel(MODEL, job_id)) == b"1"

        await poll(written, 10, "the remembered cancel to be written")
        assert len(store.cancels) == 0 and store.cancels.written == 1
