"""Exactly-once submits: Idempotency-Key and client-chosen ids; no job from a failed submit."""

from __future__ import annotations

import json

import anyio
import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.admission import Admission
from shared import codec, keys
from shared.schemas import JobRequest
from tests.gateway.conftest import MODEL, gateway, scripted_worker

pytestmark = pytest.mark.anyio


async def _jobs(r: aioredis.Redis) -> list[JobRequest]:
    return [codec.decode_as(f[codec.FIELD], JobRequest) for _, f in await r.xrange(keys.jobs_stream(MODEL))]


async def test_a_retried_job_submit_returns_the_same_job(r: aioredis.Redis) -> None:
    body = {"prompt": "hi", "params": {"temperature": 0.7}}
    async with gateway(r) as gw:
        first = await gw.post("/v1/jobs", json=body, headers={"Idempotency-Key": "k1"})
        again = await gw.post("/v1/jobs", json=body, headers={"Idempotency-Key": "k1"})
        other = await gw.post("/v1/jobs", json={"prompt": "else"}, headers={"Idempotency-Key": "k1"})
        fresh = await gw.post("/v1/jobs", json=body, headers={"Idempotency-Key": "k2"})
    assert first.status_code == again.status_code == 202
    assert again.json()["id"] == first.json()["id"] and again.headers["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first.headers
    assert other.status_code == 409 and other.json()["error"]["code"] == "conflict"
    assert fresh.json()["id"] != first.json()["id"]
    queued = await _jobs(r)
    assert [j.job_id for j in queued] == [first.json()["id"], fresh.json()["id"]]
    assert await r.ttl(keys.job_key(MODEL, first.json()["id"])) > 23 * 3600  # kept as long as the result


async def test_a_client_chosen_id(r: aioredis.Redis) -> None:
    async with gateway(r, result_ttl_s=120) as gw:
        first = await gw.post("/v1/jobs", json={"id": "order-17", "prompt": "hi"})
        again = await gw.post("/v1/jobs", json={"id": "order-17", "prompt": "hi"})
        other = await gw.post("/v1/jobs", json={"id": "order-17", "prompt": "bye"})
        info = await gw.get("/v1/jobs/order-17")
    assert first.json() == {"id": "order-17", "status": "queued"} and again.json()["id"] == "order-17"
    assert other.status_code == 409
    assert info.json()["status"] == "queued"
    assert len(await _jobs(r)) == 1
    assert 0 < await r.ttl(keys.job_key(MODEL, "order-17")) <= 120  # result_ttl_s


async def test_a_retried_completion_follows_the_first_job(r: aioredis.Redis) -> None:
    headers = {"Idempotency-Key": "abc"}
    body = {"prompt": "Say", "max_tokens": 2, "temperature": 0.9}
    async with gateway(r) as gw, scripted_worker(r) as seen:
        first = await gw.post("/v1/completions", json=body, headers=headers)
        again = await gw.post("/v1/completions", json=body, headers=headers)
        streamed = await gw.post("/v1/completions", json={**body, "stream": True}, headers=headers)
        changed = await gw.post("/v1/completions", json={**body, "max_tokens": 3}, headers=headers)
        chat = await gw.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}, headers=headers
        )
    assert len(seen) == 1  # one job ran; the retries followed it
    assert first.json()["id"] == again.json()["id"] and again.json()["choices"] == first.json()["choices"]
    chunks = [json.loads(x[6:]) for x in streamed.text.split("\n") if x.startswith("data: {")]
    assert "".join(c["choices"][0]["text"] for c in chunks) == "Hello" and streamed.text.endswith(
        "data: [DONE]\n\n"
    )
    assert chunks[0]["id"] == first.json()["id"]
    assert changed.status_code == 409 and chat.status_code == 409


async def test_idempotency_keys_are_per_api_key(r: aioredis.Redis) -> None:
    async with gateway(r, api_keys=("ka", "kb")) as gw:
        a = await gw.post(
            "/v1/jobs",
            json={"prompt": "x"},
            headers={"Idempotency-Key": "same", "Authorization": "Bearer ka"},
        )
        b = await gw.post(
            "/v1/jobs",
            json={"prompt": "x"},
            headers={"Idempotency-Key": "same", "Authorization": "Bearer kb"},
        )
        taken = await gw.post(
            "/v1/jobs", json={"id": "mine", "prompt": "x"}, headers={"Authorization": "Bearer ka"}
        )
        steal = await gw.post(
            "/v1/jobs", json={"id": "mine", "prompt": "x"}, headers={"Authorization": "Bearer kb"}
        )
    assert a.status_code == b.status_code == taken.status_code == 202 and a.json()["id"] != b.json()["id"]
    assert steal.status_code == 409  # a client id is global; another key cannot take the job over


async def test_a_bad_idempotency_key_is_a_400(r: aioredis.Redis) -> None:
    async with gateway(r) as gw:
        resp = await gw.post("/v1/jobs", json={"prompt": "x"}, headers={"Idempotency-Key": "x" * 300})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "Idempotency-Key"


class _Flaky:
    """A Redis client proxy whose script calls fail (before or after running)."""

    def __init__(self, r: aioredis.Redis, after: bool) -> None:
        self.r = r
        self.after = after

    def register_script(self, text: str):  # type: ignore[no-untyped-def]
        script = self.r.register_script(text)

        async def call(**kw):  # type: ignore[no-untyped-def]
            if self.after:
                await script(**kw)  # it ran; the reply is lost
            raise RedisConnectionError("Connection reset by peer")

        return call


async def test_a_failed_submit_enqueues_nothing_and_a_lost_reply_is_retried_safely(r: aioredis.Redis) -> None:
    async with gateway(r) as gw:
        app = gw._transport.app  # type: ignore[attr-defined]
        store = app.state.store
        real = store._admission
        store._admission = Admission(_Flaky(r, after=False))  # type: ignore[arg-type]
        down = await gw.post("/v1/jobs", json={"prompt": "x"}, headers={"Idempotency-Key": "k"})
        assert down.status_code == 503 and down.headers["Retry-After"]
        assert await r.xlen(keys.jobs_stream(MODEL)) == 0
        store._admission = Admission(_Flaky(r, after=True))  # type: ignore[arg-type]
        lost = await gw.post("/v1/jobs", json={"prompt": "x"}, headers={"Idempotency-Key": "k"})
        assert lost.status_code == 503 and await r.xlen(keys.jobs_stream(MODEL)) == 1
        store._admission = real
        retry = await gw.post("/v1/jobs", json={"prompt": "x"}, headers={"Idempotency-Key": "k"})
    assert retry.status_code == 202 and retry.headers["Idempotent-Replayed"] == "true"
    assert await r.xlen(keys.jobs_stream(MODEL)) == 1


async def test_concurrent_retries_make_one_job(r: aioredis.Redis) -> None:
    codes: list[int] = []
    async with gateway(r) as gw:

        async def one() -> None:
            resp = await gw.post("/v1/jobs", json={"prompt": "x"}, headers={"Idempotency-Key": "race"})
            codes.append(resp.status_code)

        async with anyio.create_task_group() as tg:
            for _ in range(20):
                tg.start_soon(one)
    assert codes == [202] * 20 and await r.xlen(keys.jobs_stream(MODEL)) == 1
