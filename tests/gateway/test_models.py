"""Models: each worker serves a named model; jobs go to that model's stream only."""

from __future__ import annotations

import time

import pytest
import redis.asyncio as aioredis

from shared import codec, keys
from shared.control import WorkerInfo
from shared.schemas import JobRequest
from tests.gateway.conftest import MODEL, gateway, register_worker, scripted_worker

pytestmark = pytest.mark.anyio


def _queued(entries: list) -> list[JobRequest]:
    return [codec.decode_as(f[codec.FIELD], JobRequest) for _, f in entries]


async def test_jobs_go_to_their_models_stream_only(r: aioredis.Redis) -> None:
    await register_worker(r, "b", model="other/model-b")
    async with (
        gateway(r) as gw,
        scripted_worker(r) as seen_a,
        scripted_worker(r, model="other/model-b") as seen_b,
    ):
        a = await gw.post("/v1/completions", json={"model": MODEL, "prompt": "to a"})
        b = await gw.post("/v1/completions", json={"model": "other/model-b", "prompt": "to b"})
        job = await gw.post("/v1/jobs", json={"model": "other/model-b", "prompt": "job to b"})
        assert job.status_code == 202
        info = (await gw.get(f"/v1/jobs/{job.json()['id']}")).json()
    assert a.json()["model"] == MODEL and b.json()["model"] == "other/model-b"
    assert [j.prompt for j in seen_a] == ["to a"] and [j.model for j in seen_a] == [MODEL]
    assert sorted(j.prompt or "" for j in seen_b) == ["job to b", "to b"]
    assert info["model"] == "other/model-b"
    # The keys of one model share its hash tag (one Redis Cluster slot).
    tag = "{" + keys.model_tag("other/model-b") + "}"
    assert tag in keys.jobs_stream("other/model-b") and tag in keys.job_key("other/model-b", "x")
    assert "/" not in tag and keys.model_tag(MODEL) == MODEL


async def test_unknown_model_is_a_404_in_openais_shape(r: aioredis.Redis) -> None:
    async with gateway(r) as gw:
        for route, body in (
            ("/v1/completions", {"model": "nope", "prompt": "x"}),
            ("/v1/chat/completions", {"model": "nope", "messages": [{"role": "user", "content": "x"}]}),
            ("/v1/jobs", {"model": "nope", "prompt": "x"}),
        ):
            resp = await gw.post(route, json=body)
            assert resp.status_code == 404, route
            assert resp.json() == {
                "error": {
                    "message": "The model `nope` does not exist.",
                    "type": "not_found_error",
                    "param": "model",
                    "code": "model_not_found",
                }
            }
        assert (await gw.get("/v1/models/nope")).json()["error"]["code"] == "model_not_found"
    assert await r.xlen(keys.jobs_stream("nope")) == 0


async def test_model_omitted_is_the_only_model_or_a_400(r: aioredis.Redis) -> None:
    async with gateway(r) as gw, scripted_worker(r) as seen:
        assert (await gw.post("/v1/completions", json={"prompt": "x"})).json()["model"] == MODEL
    await register_worker(r, "b", model="b")
    async with gateway(r) as gw:
        r2 = await gw.post("/v1/completions", json={"prompt": "x"})
    assert [j.model for j in seen] == [MODEL]
    assert r2.status_code == 400 and r2.json()["error"]["param"] == "model"
    assert "b, fake-model" in r2.json()["error"]["message"]


async def test_models_list_live_models_with_their_context(r: aioredis.Redis) -> None:
    now = time.time()
    for wid, model, ts, n in (("a", "tiny", now, 512), ("b", "tiny", now, 256), ("c", "gone", now - 600, 9)):
        info = WorkerInfo(worker_id=wid, model=model, ts=ts, started_at=now - 5, max_model_len=n)
        await r.hset(keys.WORKERS, wid, codec.encode(info))
    async with gateway(r, worker=False) as gw:
        listed = (await gw.get("/v1/models")).json()
        one = await gw.get("/v1/models/tiny")
        gone = await gw.get("/v1/models/gone")
    assert [m["id"] for m in listed["data"]] == ["tiny"]
    assert listed["data"][0]["max_model_len"] == 256 and listed["data"][0]["object"] == "model"
    assert one.status_code == 200 and one.json()["id"] == "tiny" and one.json()["max_model_len"] == 256
    assert gone.status_code == 404


async def test_a_job_id_is_bound_to_its_model(r: aioredis.Redis) -> None:
    await register_worker(r, "b", model="b")
    async with gateway(r) as gw:
        first = await gw.post("/v1/jobs", json={"id": "mine", "model": MODEL, "prompt": "x"})
        again = await gw.post("/v1/jobs", json={"id": "mine", "model": MODEL, "prompt": "x"})
        other = await gw.post("/v1/jobs", json={"id": "mine", "model": "b", "prompt": "x"})
    assert first.status_code == 202 and again.headers.get("Idempotent-Replayed") == "true"
    assert other.status_code == 409 and other.json()["error"]["code"] == "conflict"
    assert await r.xlen(keys.jobs_stream("b")) == 0
