"""The job API: model, metadata, OpenAI's names, lists of jobs, GET /v1/jobs."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from shared import codec, keys
from shared.schemas import JobRequest
from tests.gateway.conftest import MODEL, gateway, scripted_worker

pytestmark = pytest.mark.anyio


async def _queued(r: aioredis.Redis) -> list[JobRequest]:
    return [codec.decode_as(f[codec.FIELD], JobRequest) for _, f in await r.xrange(keys.jobs_stream(MODEL))]


async def test_openai_names_at_the_top_level_and_params_win(r: aioredis.Redis) -> None:
    body = {
        "prompt": "x",
        "max_tokens": 7,
        "temperature": 0.5,
        "stop": "\n",
        "seed": 3,
        "params": {"seed": 4},
    }
    async with gateway(r) as gw:
        resp = await gw.post("/v1/jobs", json={**body, "model": MODEL, "metadata": {"k": "v"}})
        plain = await gw.post("/v1/jobs", json={"prompt": "y"})
        bad = await gw.post("/v1/jobs", json={"prompt": "y", "temperature": 99})
        info = (await gw.get(f"/v1/jobs/{resp.json()['id']}")).json()
    assert resp.status_code == 202
    job, default = await _queued(r)
    assert job.params.max_tokens == 7 and job.params.temperature == 0.5 and job.params.stop == ["\n"]
    assert job.params.seed == 4 and job.metadata == {"k": "v"} and job.model == MODEL
    assert default.params.temperature == 0.0 and default.params.max_tokens == 64  # the job API's defaults
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "temperature"
    assert info["metadata"] == {"k": "v"} and info["model"] == MODEL and info["object"] == "job"
    assert plain.status_code == 202


async def test_a_list_of_jobs_in_one_call(r: aioredis.Redis) -> None:
    bodies = [{"prompt": f"p{i}"} for i in range(3)]
    async with gateway(r) as gw:
        resp = await gw.post("/v1/jobs", json=bodies, headers={"Idempotency-Key": "k"})
        again = await gw.post("/v1/jobs", json=bodies, headers={"Idempotency-Key": "k"})
        empty = await gw.post("/v1/jobs", json=[])
        bad = await gw.post("/v1/jobs", json=[{"prompt": "a"}, {"colour": 1}])
    data = resp.json()["data"]
    assert resp.status_code == 202 and resp.json()["object"] == "list" and len(data) == 3
    assert [d["id"] for d in again.json()["data"]] == [d["id"] for d in data]  # a retry: the same jobs
    assert [j.prompt for j in await _queued(r)] == ["p0", "p1", "p2"]
    assert empty.status_code == 400 and bad.status_code == 400


async def test_listing_is_per_owner_newest_first_with_a_cursor_and_a_status_filter(r: aioredis.Redis) -> None:
    keyed = {"api_keys": ("ka", "kb")}
    a = {"Authorization": "Bearer ka"}
    async with gateway(r, **keyed) as gw:
        ids = [
            (await gw.post("/v1/jobs", json={"prompt": f"p{i}"}, headers=a)).json()["id"] for i in range(5)
        ]
        await gw.post("/v1/jobs", json={"prompt": "other"}, headers={"Authorization": "Bearer kb"})
        first = (await gw.get("/v1/jobs?limit=2", headers=a)).json()
        second = (await gw.get(f"/v1/jobs?limit=2&after={first['last_id']}", headers=a)).json()
        third = (await gw.get(f"/v1/jobs?limit=2&after={second['last_id']}", headers=a)).json()
        await gw.delete(f"/v1/jobs/{ids[1]}", headers=a)  # queued: cancelling, still queued
        queued = (await gw.get("/v1/jobs?status=queued", headers=a)).json()
        finished = (await gw.get("/v1/jobs?status=finished", headers=a)).json()
        bad = await gw.get("/v1/jobs?status=nope", headers=a)
        theirs = (await gw.get("/v1/jobs", headers={"Authorization": "Bearer kb"})).json()
    listed = [j["id"] for page in (first, second, third) for j in page["data"]]
    assert listed == ids[::-1]
    assert first["has_more"] and second["has_more"] and not third["has_more"]
    assert len(queued["data"]) == 5 and finished["data"] == []
    assert bad.status_code == 400
    assert [j["id"] for j in theirs["data"]] not in ids and len(theirs["data"]) == 1


async def test_listing_shows_results(r: aioredis.Redis) -> None:
    async with gateway(r) as gw, scripted_worker(r):
        job_id = (await gw.post("/v1/jobs", json={"prompt": "x"})).json()["id"]
        await gw.post("/v1/completions", json={"prompt": "y"})  # waits for its result
        for _ in range(200):
            page = (await gw.get("/v1/jobs?status=finished")).json()
            if job_id in [j["id"] for j in page["data"]]:
                break
    (job,) = [j for j in page["data"] if j["id"] == job_id]
    assert job["result"]["text"] == "Hello"
