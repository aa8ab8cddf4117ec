"""Deadlines, streams that always end, and failures in the middle of a stream."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from shared import codec, jobs, keys
from shared.schemas import JobRequest, StartEvent, TokenEvent
from shared.streams import ensure_group, entries
from tests.gateway.conftest import MODEL, gateway, hello

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def stalling_worker(r: aioredis.Redis) -> AsyncIterator[list[str]]:
    """Starts every job and sends one token, then never finishes it."""
    seen: list[str] = []
    await ensure_group(r, keys.jobs_stream(MODEL), keys.JOBS_GROUP)

    async def serve() -> None:
        while True:
            resp = await r.xreadgroup(
                keys.JOBS_GROUP, "stall", {keys.jobs_stream(MODEL): ">"}, count=10, block=50
            )
            for _, fields in entries(resp):
                job = codec.decode_as(fields[codec.FIELD], JobRequest)
                seen.append(job.job_id)
                async with r.pipeline(transaction=False) as pipe:
                    jobs.add_events(
                        pipe,
                        job.job_id,
                        [
                            StartEvent(job_id=job.job_id, worker_id="stall"),
                            TokenEvent(job_id=job.job_id, index=0, token_ids=[1], text="Hi"),
                        ],
                        model=MODEL,
                    )
                    await pipe.execute()

    async with anyio.create_task_group() as tg:
        tg.start_soon(serve)
        yield seen
        tg.cancel_scope.cancel()


def _data(text: str) -> list[str]:
    return [line[6:] for line in text.split("\n") if line.startswith("data: ")]


async def test_a_request_past_its_deadline_is_a_504_and_its_job_is_cancelled(r: aioredis.Redis) -> None:
    async with gateway(r, request_timeout_s=0.3, keepalive_s=0.1) as gw:  # no worker runs the job
        with anyio.fail_after(10):
            resp = await gw.post("/v1/completions", json={"prompt": "x"})
            early = await gw.post("/v1/completions", json={"prompt": "x", "stream": True})
    for got in (resp, early):  # a stream that has not started yet is a 504 too
        assert got.status_code == 504 and got.json()["error"]["code"] == "timeout"
    ids = [
        codec.decode_as(f[codec.FIELD], JobRequest).job_id for _, f in await r.xrange(keys.jobs_stream(MODEL))
    ]
    assert len(ids) == 2
    for job_id in ids:
        assert await r.get(keys.job_cancel(MODEL, job_id)) == b"1"


async def test_a_stream_past_its_deadline_ends_with_an_error_chunk_and_done(r: aioredis.Redis) -> None:
    async with gateway(r, request_timeout_s=0.5, keepalive_s=0.1) as gw, stalling_worker(r) as seen:
        with anyio.fail_after(10):
            resp = await gw.post(
                "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "stream": True}
            )
    data = _data(resp.text)
    assert resp.status_code == 200 and data[-1] == "[DONE]"
    assert json.loads(data[0])["choices"][0]["delta"]["content"] == "Hi"
    assert json.loads(data[-2])["error"]["code"] == "timeout"
    assert await r.get(keys.job_cancel(MODEL, seen[0])) == b"1"


async def test_a_redis_failure_mid_stream_ends_with_an_error_chunk_and_done(
    r: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the outage grace period (a shorter outage is ridden out: tests/gateway/test_outage.py)."""
    async with gateway(r, keepalive_s=0.1, outage_grace_s=0.3) as gw, stalling_worker(r) as seen:
        real_xread = r.xread
        delivered = False

        async def flaky_xread(*args, **kwargs):  # type: ignore[no-untyped-def]
            nonlocal delivered
            if delivered:  # Redis goes away once the stream has started
                raise RedisConnectionError("Connection reset by peer")
            got = await real_xread(*args, **kwargs)
            delivered = bool(entries(got))
            return got

        real_hget = r.hget

        async def flaky_hget(*args, **kwargs):  # type: ignore[no-untyped-def]
            if delivered:  # (the reader's look at the job's status fails the same way)
                raise RedisConnectionError("Connection reset by peer")
            return await real_hget(*args, **kwargs)

        monkeypatch.setattr(r, "xread", flaky_xread)
        monkeypatch.setattr(r, "hget", flaky_hget)
        with anyio.fail_after(10):
            resp = await gw.post("/v1/completions", json={"prompt": "x", "stream": True})
    data = _data(resp.text)
    assert data[-1] == "[DONE]" and json.loads(data[-2])["error"]["code"] == "unavailable"
    assert await r.get(keys.job_cancel(MODEL, seen[0])) == b"1"  # the client got an error: no work goes on


async def _finish(r: aioredis.Redis, job_id: str) -> list[str]:
    *events, final = hello(JobRequest(job_id=job_id, prompt="x"))
    async with r.pipeline(transaction=False) as pipe:
        jobs.add_events(pipe, job_id, events, model=MODEL)
        jobs.add_result(pipe, final, model=MODEL)  # type: ignore[arg-type]
        await pipe.execute()
    return [eid.decode() for eid, _ in await r.xrange(keys.job_events(MODEL, job_id))]


async def test_streams_of_finished_jobs_always_end(r: aioredis.Redis) -> None:
    async with gateway(r, keepalive_s=30) as gw:  # a keep-alive would take 30 s: ends must not wait for it
        job_id = (await gw.post("/v1/jobs", json={"prompt": "x"})).json()["id"]
        ids = await _finish(r, job_id)
        with anyio.fail_after(5):
            at_end = await gw.get(f"/v1/jobs/{job_id}/events", headers={"Last-Event-ID": ids[-1]})
            past = await gw.get(f"/v1/jobs/{job_id}/events", headers={"Last-Event-ID": "99999999999999-0"})
            full = await gw.get(f"/v1/jobs/{job_id}/events")
        assert at_end.status_code == past.status_code == 200 and at_end.text == past.text == ""
        assert full.text.count("event: ") == 4
        # A job cancelled before any worker took it has no events at all: its stream ends too.
        other = (await gw.post("/v1/jobs", json={"prompt": "x"})).json()["id"]
        await r.hset(keys.job_key(MODEL, other), jobs.STATUS, jobs.JobStatus.CANCELLED.value)
        with anyio.fail_after(5):
            assert (await gw.get(f"/v1/jobs/{other}/events")).text == ""


async def test_a_stream_that_was_waiting_ends_when_the_job_ends(r: aioredis.Redis) -> None:
    async with gateway(r, keepalive_s=0.1) as gw:
        job_id = (await gw.post("/v1/jobs", json={"prompt": "x"})).json()["id"]
        ids = await _finish(r, job_id)
        await r.delete(keys.job_events(MODEL, job_id))  # the events expired; the record remains
        with anyio.fail_after(5):
            resp = await gw.get(f"/v1/jobs/{job_id}/events", headers={"Last-Event-ID": ids[0]})
    assert resp.status_code == 200 and "event:" not in resp.text


async def test_positions_written_again_after_a_lossy_failover_are_not_sent_twice(r: aioredis.Redis) -> None:
    """A Redis failover lost writes this reader had been sent; the job's re-run writes those
    positions again after them (worker/leases.py). The client gets each position once."""
    from shared.schemas import FinishEvent

    async with gateway(r) as gw:
        job_id = (await gw.post("/v1/jobs", json={"prompt": "x"})).json()["id"]
        first = [StartEvent(job_id=job_id, worker_id="wA")]
        first += [TokenEvent(job_id=job_id, index=i, token_ids=[10 + i], text=f"t{i}") for i in range(3)]
        rerun = [StartEvent(job_id=job_id, worker_id="wB", attempt=2)]
        rerun += [TokenEvent(job_id=job_id, index=i, token_ids=[10 + i], text=f"t{i}") for i in (1, 2, 3)]
        final = FinishEvent(
            job_id=job_id, finish_reason="length", text="t0t1t2t3", token_ids=[10, 11, 12, 13],
            prompt_tokens=1, completion_tokens=4,
        )  # fmt: skip
        async with r.pipeline(transaction=False) as pipe:
            jobs.add_events(pipe, job_id, first + rerun, model=MODEL)
            jobs.add_result(pipe, final, model=MODEL)
            await pipe.execute()
        with anyio.fail_after(5):
            resp = await gw.get(f"/v1/jobs/{job_id}/events")
    sent = [json.loads(d) for d in _data(resp.text)]
    positions = [e["index"] for e in sent if "index" in e]
    assert positions == [0, 1, 2, 3]
    assert [e.get("attempt") for e in sent if "worker_id" in e and "index" not in e][:2] == [1, 2]
