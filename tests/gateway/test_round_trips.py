"""What a request costs in Redis round trips: a fresh submit is one pipeline, a final-only
reader looks at its job's status once and gets its timeline with its final event."""

from __future__ import annotations

from typing import Any

import anyio
import httpx
import pytest
import redis.asyncio as aioredis

from gateway.app import create_app
from gateway.errors import APIError
from gateway.ids import new_job_id
from gateway.metrics import GatewayMetrics, MeteredStore
from gateway.settings import GatewaySettings
from gateway.store import JobStore
from shared import jobs, keys
from shared.errors import ErrorCode
from shared.schemas import FinishEvent, JobRequest, SamplingParams, StartEvent, TokenEvent
from tests.gateway.conftest import MODEL, gateway, register_worker, scripted_worker

pytestmark = pytest.mark.anyio


class RoundTrips:
    """Records each round trip of ``r``: a command's name, or ``pipeline:`` and the names of
    the commands it sent."""

    def __init__(self, r: aioredis.Redis) -> None:
        self.trips: list[str] = []
        real_command, real_pipeline = r.execute_command, r.pipeline

        async def command(*args: Any, **kwargs: Any) -> Any:
            self.trips.append(_name(args[0]))
            return await real_command(*args, **kwargs)

        def pipeline(*args: Any, **kwargs: Any) -> Any:
            pipe = real_pipeline(*args, **kwargs)
            real_execute = pipe.execute

            async def execute(*eargs: Any, **ekwargs: Any) -> Any:
                names = ",".join(_name(c[0][0]) for c in pipe.command_stack)
                self.trips.append(f"pipeline:{names}")
                return await real_execute(*eargs, **ekwargs)

            pipe.execute = execute  # type: ignore[method-assign]
            return pipe

        r.execute_command = command  # type: ignore[method-assign]
        r.pipeline = pipeline  # type: ignore[method-assign]

    def having(self, name: str) -> list[str]:
        """The trips that sent command ``name`` (alone or in a pipeline)."""
        return [t for t in self.trips if name in t.removeprefix("pipeline:").split(",")]


def _name(command: Any) -> str:
    return (command.decode() if isinstance(command, bytes) else str(command)).upper()


def _job(max_tokens: int = 4) -> JobRequest:
    return JobRequest(
        job_id=new_job_id(), model=MODEL, prompt="x", params=SamplingParams(max_tokens=max_tokens)
    )


async def test_a_fresh_submit_is_one_round_trip_that_binds_admits_and_indexes(r: aioredis.Redis) -> None:
    store = JobStore(r, GatewaySettings())
    await store.submit(_job(), owner="o", fingerprint="f", fresh=True)  # loads the script
    job = _job()
    trips = RoundTrips(r)
    got = await store.submit(job, owner="o", fingerprint="f", fresh=True)
    assert trips.trips == ["pipeline:SET,EVALSHA,ZADD,ZREMRANGEBYSCORE,EXPIRE"]
    assert got.created and got.status == jobs.JobStatus.QUEUED.value
    assert await r.get(keys.job_model(job.job_id)) == MODEL.encode()
    assert await r.hget(keys.job_key(MODEL, job.job_id), jobs.STATUS) == b"queued"
    assert await r.xlen(keys.jobs_stream(MODEL)) == 2
    assert (await r.zrange(keys.owner_jobs("o"), 0, -1))[-1] == job.job_id.encode()
    assert (await store.info(job.job_id, "o"))["status"] == "queued"


async def test_a_fresh_submit_the_queue_refuses_leaves_no_job_and_no_index_entry(r: aioredis.Redis) -> None:
    store = JobStore(r, GatewaySettings())
    kept = _job()
    await store.submit(kept, owner="o", fingerprint="f", fresh=True)
    with pytest.raises(APIError) as refused:
        await store.submit(_job(), owner="o", fingerprint="g", max_queue=1, fresh=True)
    assert refused.value.code == ErrorCode.QUEUE_FULL.value and refused.value.status == 429
    assert await r.xlen(keys.jobs_stream(MODEL)) == 1
    assert await r.zrange(keys.owner_jobs("o"), 0, -1) == [kept.job_id.encode()]


async def test_a_fresh_submit_loads_the_admission_script_when_redis_lost_it(r: aioredis.Redis) -> None:
    store = JobStore(r, GatewaySettings())
    await store.submit(_job(), owner="o", fingerprint="f", fresh=True)
    await r.script_flush()  # as after a Redis restart
    job = _job()
    got = await store.submit(job, owner="o", fingerprint="f", fresh=True)
    assert got.created and await r.xlen(keys.jobs_stream(MODEL)) == 2
    assert await r.hget(keys.job_key(MODEL, job.job_id), jobs.STATUS) == b"queued"
    trips = RoundTrips(r)
    await store.submit(_job(), owner="o", fingerprint="f", fresh=True)
    assert len(trips.trips) == 1  # loaded again: one round trip as before


async def test_a_request_with_an_idempotency_key_still_binds_its_id_first(r: aioredis.Redis) -> None:
    async with gateway(r) as gw:
        await gw.post(
            "/v1/jobs", json={"prompt": "x"}, headers={"Idempotency-Key": "first"}
        )  # loads the script
        trips = RoundTrips(r)
        resp = await gw.post("/v1/jobs", json={"prompt": "x"}, headers={"Idempotency-Key": "k"})
    assert resp.status_code == 202
    writes = [t for t in trips.trips if t in ("SET", "EVALSHA") or t.startswith("pipeline:")]
    assert writes == ["SET", "EVALSHA", "pipeline:ZADD,ZREMRANGEBYSCORE,EXPIRE"]


async def test_a_completion_reads_its_job_status_once_and_its_timeline_with_its_final(
    r: aioredis.Redis,
) -> None:
    app = create_app(GatewaySettings(), redis=r)
    await register_worker(r)
    async with (
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as gw,
        scripted_worker(r),
    ):
        await gw.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})  # the hub is reading
        trips = RoundTrips(r)
        resp = await gw.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
    assert resp.status_code == 200 and resp.json()["choices"][0]["text"] == "Hello"
    assert len(trips.having("HGET")) == 1  # the hub's look at the status as it follows the job
    assert trips.having("XRANGE") == ["pipeline:XRANGE"]  # the final event and the timeline at once
    assert not trips.having("XREVRANGE")
    metrics: GatewayMetrics = app.state.metrics
    assert _count(metrics, "request_queue_time_seconds") == 2  # the timeline was observed
    assert _count(metrics, "inter_token_latency_seconds") == 2  # 2 tokens each, the first is TTFT


def _count(metrics: GatewayMetrics, name: str) -> float:
    """Observations of histogram ``name``, over all its label values."""
    samples = [s for f in metrics.registry.collect() for s in f.samples]
    return sum(s.value for s in samples if s.name == f"nightjar:{name}_count")


async def test_a_final_only_reader_gets_what_it_asked_for_and_a_gone_job_ends_at_once(
    r: aioredis.Redis,
) -> None:
    store = MeteredStore(JobStore(r, GatewaySettings()), GatewayMetrics())
    job = _job()
    await store.submit(job, owner="", fingerprint="f", fresh=True)
    events = [
        StartEvent(job_id=job.job_id, worker_id="w", prompt_tokens=1),
        TokenEvent(job_id=job.job_id, index=0, token_ids=[1], text="a"),
    ]
    final = FinishEvent(
        job_id=job.job_id, worker_id="w", text="a", token_ids=[1], finish_reason="length", prompt_tokens=1,
        completion_tokens=1,
    )  # fmt: skip
    async with r.pipeline(transaction=False) as pipe:
        jobs.add_events(pipe, job.job_id, events, model=MODEL)
        jobs.add_result(pipe, final, model=MODEL)
        await pipe.execute()
    with anyio.fail_after(5):
        only = [ev.msg async for ev in store.events(job.job_id, block_s=30, final_only=True) if ev]
        every = [
            ev.msg async for ev in store.events(job.job_id, block_s=30, final_only=True, history=True) if ev
        ]
    assert only == [final] and every == [*events, final]
    await r.delete(keys.job_key(MODEL, job.job_id), keys.job_events(MODEL, job.job_id))  # expired
    with anyio.fail_after(5):  # no wait for a keep-alive: nothing will come
        assert [ev async for ev in store.events(job.job_id, block_s=30, final_only=True)] == []
