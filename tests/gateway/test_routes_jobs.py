from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from shared import codec, jobs, keys
from shared.schemas import CancelRequest, JobRequest
from tests.gateway.conftest import MODEL, gateway, hello

pytestmark = pytest.mark.anyio


def _sse(text: str) -> list[dict[str, str]]:
    out = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.split("\n") if not line.startswith(":"))
        if fields:
            out.append(fields)
    return out


async def test_submit_enqueues_sampling_jobs_as_they_were_asked(r: aioredis.Redis) -> None:
    async with gateway(r) as gw:
        greedy = await gw.post("/v1/jobs", json={"prompt": "hi", "params": {"max_tokens": 4}})
        sampled = await gw.post("/v1/jobs", json={"prompt_token_ids": [1, 2], "params": {"temperature": 0.8}})
    assert greedy.status_code == 202 and set(greedy.json()) == {"id", "status"}
    queued = [codec.decode_as(f[codec.FIELD], JobRequest) for _, f in await r.xrange(keys.jobs_stream(MODEL))]
    assert [j.job_id for j in queued] == [greedy.json()["id"], sampled.json()["id"]]
    assert queued[0].params.seed is None and queued[0].params.max_tokens == 4
    # No seed chosen for it: unseeded sampling is verified by rejection sampling, which accepts
    # more drafts than a seed's keyed draws (docs/speculation.md "Seeded sampling").
    assert queued[1].params.seed is None and queued[1].params.temperature == 0.8
    assert await r.hget(keys.job_key(MODEL, queued[0].job_id), jobs.STATUS) == b"queued"


@pytest.mark.parametrize(
    "body, param",
    [
        ({"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, None),
        ({}, None),
        ({"prompt": "a", "params": {"max_tokens": 0}}, "params.max_tokens"),
        ({"prompt": "a", "colour": "red"}, "colour"),
    ],
)
async def test_bad_submissions_get_400_with_an_error_body(
    r: aioredis.Redis, body: dict, param: str | None
) -> None:
    async with gateway(r) as gw:
        resp = await gw.post("/v1/jobs", json=body)
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"] and err["param"] == param


async def test_status_events_and_resume(r: aioredis.Redis) -> None:
    async with gateway(r) as gw:
        job_id = (await gw.post("/v1/jobs", json={"prompt": "hi"})).json()["id"]
        assert (await gw.get(f"/v1/jobs/{job_id}")).json()["status"] == "queued"
        job = JobRequest(job_id=job_id, prompt="hi")
        *events, final = hello(job)
        async with r.pipeline(transaction=False) as pipe:
            jobs.add_events(pipe, job_id, events, model=MODEL)
            jobs.add_result(pipe, final, model=MODEL)  # type: ignore[arg-type]
            await pipe.execute()
        info = (await gw.get(f"/v1/jobs/{job_id}")).json()
        assert info["status"] == "finished" and info["result"]["text"] == "Hello" and info["error"] is None
        resp = await gw.get(f"/v1/jobs/{job_id}/events")
        assert resp.headers["content-type"].startswith("text/event-stream")
        got = _sse(resp.text)
        assert [e["event"] for e in got] == ["start", "token", "token", "finish"]
        ids = [id_.decode() for id_, _ in await r.xrange(keys.job_events(MODEL, job_id))]
        assert [e["id"] for e in got] == ids
        resumed = _sse((await gw.get(f"/v1/jobs/{job_id}/events", headers={"Last-Event-ID": ids[1]})).text)
        assert [e["event"] for e in resumed] == ["token", "finish"]
        assert (
            await gw.get(f"/v1/jobs/{job_id}/events", headers={"Last-Event-ID": "nope"})
        ).status_code == 400
        assert (await gw.get("/v1/jobs/unknown")).status_code == 404
        assert (await gw.get("/v1/jobs/unknown/events")).json()["error"]["code"] == "job_not_found"


async def test_cancel(r: aioredis.Redis) -> None:
    async with gateway(r) as gw:
        job_id = (await gw.post("/v1/jobs", json={"prompt": "hi"})).json()["id"]
        resp = await gw.delete(f"/v1/jobs/{job_id}")
        assert resp.status_code == 202 and resp.json() == {"id": job_id, "status": "cancelling"}
        assert await r.get(keys.job_cancel(MODEL, job_id)) == b"1"
        ((_, fields),) = await r.xrange(keys.cancel_stream(MODEL))
        assert codec.from_entry(fields) == CancelRequest(job_id=job_id)
        await r.hset(keys.job_key(MODEL, job_id), jobs.STATUS, "finished")
        done = await gw.delete(f"/v1/jobs/{job_id}")
        assert done.status_code == 200 and done.json()["status"] == "finished"
        assert (await gw.delete("/v1/jobs/unknown")).status_code == 404


async def test_backpressure_rejects_past_the_limit(r: aioredis.Redis) -> None:
    async with gateway(r, max_queue=2) as gw:
        for _ in range(2):
            assert (await gw.post("/v1/jobs", json={"prompt": "hi"})).status_code == 202
        resp = await gw.post("/v1/jobs", json={"prompt": "hi"})
        assert resp.status_code == 429 and resp.json()["error"]["code"] == "queue_full"
        assert int(resp.headers["Retry-After"]) >= 1
        health = (await gw.get("/health")).json()
    assert health == {"status": "ok", "workers": 1, "queued": 2, "batch_queued": 0}
    assert await r.xlen(keys.jobs_stream(MODEL)) == 2


async def test_unparseable_json_and_unknown_routes_get_json_errors(r: aioredis.Redis) -> None:
    async with gateway(r) as gw:
        bad_json = await gw.post(
            "/v1/jobs", content=b"{not json", headers={"content-type": "application/json"}
        )
        missing = await gw.get("/v1/nowhere")
        wrong_method = await gw.put("/v1/jobs")
    assert bad_json.status_code == 400 and bad_json.json()["error"]["param"] is None
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
    assert wrong_method.status_code == 405 and "error" in wrong_method.json()


async def test_an_unreachable_store_is_a_503_with_a_json_body() -> None:
    down = aioredis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=1)  # nothing listens there
    async with gateway(down, worker=False) as gw:
        resp = await gw.post("/v1/jobs", json={"prompt": "hi"})
    assert resp.status_code == 503 and int(resp.headers["Retry-After"]) >= 1
    error = resp.json()["error"]
    assert error["type"] == "service_unavailable" and "Redis" in error["message"]
    await down.aclose()
