"""API keys on every /v1 route, jobs visible to their owner only, per-key rate limits."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from gateway.admission import OWNER
from gateway.auth import TokenBuckets, owner_of
from shared import keys
from tests.gateway.conftest import MODEL, gateway, scripted_worker

pytestmark = pytest.mark.anyio

A = {"Authorization": "Bearer key-a"}
B = {"Authorization": "Bearer key-b"}


async def test_every_v1_route_needs_a_key(r: aioredis.Redis) -> None:
    # (24 failed attempts from one address on purpose: no failed-auth limit here)
    async with gateway(r, api_keys=("key-a", "key-b"), auth_failures_per_min=0) as gw:
        for method, path in (
            ("POST", "/v1/jobs"),
            ("GET", "/v1/jobs/abc"),
            ("GET", "/v1/jobs/abc/events"),
            ("DELETE", "/v1/jobs/abc"),
            ("POST", "/v1/completions"),
            ("POST", "/v1/chat/completions"),
            ("GET", "/v1/models"),
            ("GET", "/v1/nowhere"),
        ):
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic key-a"}):
                resp = await gw.request(method, path, json={"prompt": "x"}, headers=headers)
                assert resp.status_code == 401, (method, path, headers)
                err = resp.json()["error"]
                assert err["code"] == "unauthorized" and err["type"] == "authentication_error"
        assert (await gw.get("/health")).status_code == 200  # health stays open
        assert (await gw.get("/v1/models", headers=A)).status_code == 200
        # A bad body with no key is still a 401: keys are checked before the body is read.
        assert (await gw.post("/v1/jobs", content=b"{nope")).status_code == 401
    assert await r.xlen(keys.jobs_stream(MODEL)) == 0


async def test_jobs_are_invisible_to_other_keys(r: aioredis.Redis) -> None:
    async with gateway(r, api_keys=("key-a", "key-b")) as gw:
        job_id = (await gw.post("/v1/jobs", json={"prompt": "x"}, headers=A)).json()["id"]
        for method, path in (
            ("GET", f"/v1/jobs/{job_id}"),
            ("GET", f"/v1/jobs/{job_id}/events"),
            ("DELETE", f"/v1/jobs/{job_id}"),
        ):
            resp = await gw.request(method, path, headers=B)
            assert resp.status_code == 404 and resp.json()["error"]["code"] == "job_not_found"
            assert resp.json() == (await gw.request(method, "/v1/jobs/nosuchjob", headers=B)).json() | {
                "error": resp.json()["error"] | {"message": f"no job {job_id}"}
            }
        assert await r.get(keys.job_cancel(MODEL, job_id)) is None  # B's DELETE did nothing
        assert (await gw.get(f"/v1/jobs/{job_id}", headers=A)).json()["status"] == "queued"
        assert (await gw.delete(f"/v1/jobs/{job_id}", headers=A)).status_code == 202
    stored = await r.hget(keys.job_key(MODEL, job_id), OWNER)
    assert stored == owner_of("key-a").encode() and b"key-a" not in stored


async def test_completions_work_with_a_key(r: aioredis.Redis) -> None:
    async with gateway(r, api_keys=("key-a",)) as gw, scripted_worker(r):
        resp = await gw.post("/v1/completions", json={"prompt": "x"}, headers=A)
    assert resp.status_code == 200 and resp.json()["choices"][0]["text"] == "Hello"


async def test_open_gateway_warns_and_serves(r: aioredis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    from gateway.app import create_app
    from gateway.settings import GatewaySettings

    app = create_app(GatewaySettings(), redis=r)
    with caplog.at_level("WARNING", logger="nightjar.gateway"):
        async with app.router.lifespan_context(app):
            pass
    assert any("no API key configured" in rec.message for rec in caplog.records)


async def test_rate_limit_per_key(r: aioredis.Redis) -> None:
    async with gateway(r, api_keys=("key-a", "key-b"), rate_limit_rps=0.5, rate_limit_burst=2) as gw:
        codes = [(await gw.get("/v1/models", headers=A)).status_code for _ in range(3)]
        limited = await gw.get("/v1/models", headers=A)
        other = await gw.get("/v1/models", headers=B)  # a bucket of its own
    assert codes == [200, 200, 429]
    assert limited.status_code == 429 and limited.json()["error"]["code"] == "rate_limited"
    assert limited.json()["error"]["type"] == "rate_limit_error"
    assert 1 <= int(limited.headers["Retry-After"]) <= 2
    assert other.status_code == 200


def test_token_buckets_refill() -> None:
    buckets = TokenBuckets(rate=2.0, burst=2)
    assert [buckets.take("k", now=0.0) for _ in range(2)] == [0.0, 0.0]
    assert buckets.take("k", now=0.0) == pytest.approx(0.5)
    assert buckets.take("k", now=0.5) == 0.0  # one token back after 1/rate
    assert buckets.take("k", now=0.5) > 0
    assert buckets.take("other", now=0.5) == 0.0
