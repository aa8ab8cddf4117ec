"""Failed-auth limiter per client address (429 with Retry-After past the limit, a right key
included), and keys on /metrics (off by default) and /docs, /openapi.json (on by default
when keys are configured)."""

from __future__ import annotations

import httpx
import pytest
import redis.asyncio as aioredis

from gateway.auth import FAILURE_WINDOW_S, FailedAuth
from tests.gateway.conftest import gateway

pytestmark = pytest.mark.anyio

KEYS = ("key-a",)
GOOD = {"Authorization": "Bearer key-a"}
BAD = {"Authorization": "Bearer guess"}


def _error(resp: httpx.Response, status: int, code: str) -> None:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == code


async def test_failed_auth_past_the_limit_is_a_429_with_retry_after(r: aioredis.Redis) -> None:
    async with gateway(r, api_keys=KEYS, auth_failures_per_min=5) as gw:
        for _ in range(4):
            _error(await gw.get("/v1/models", headers=BAD), 401, "unauthorized")
        assert (await gw.get("/v1/models", headers=GOOD)).status_code == 200  # 4 failures: not blocked
        _error(await gw.get("/v1/models", headers=BAD), 401, "unauthorized")  # the 5th
        blocked = await gw.get("/v1/models", headers=BAD)
        _error(blocked, 429, "rate_limited")
        assert 1 <= int(blocked.headers["Retry-After"]) <= FAILURE_WINDOW_S
        assert "failed authentication" in blocked.json()["error"]["message"]
        # While blocked, a right key from that address is a 429 too (no oracle for guessing).
        _error(await gw.get("/v1/models", headers=GOOD), 429, "rate_limited")
        _error(await gw.post("/v1/jobs", json={"prompt": "x"}), 429, "rate_limited")
        assert (await gw.get("/health")).status_code == 200  # unguarded routes stay open


async def test_the_default_limit_is_20_a_minute(r: aioredis.Redis) -> None:
    async with gateway(r, api_keys=KEYS) as gw:
        codes = [(await gw.get("/v1/models", headers=BAD)).status_code for _ in range(21)]
    assert codes == [401] * 20 + [429]


async def test_no_limit_with_zero(r: aioredis.Redis) -> None:
    async with gateway(r, api_keys=KEYS, auth_failures_per_min=0) as gw:
        codes = {(await gw.get("/v1/models", headers=BAD)).status_code for _ in range(40)}
    assert codes == {401}


def test_failures_age_out_of_the_window() -> None:
    limits = FailedAuth(3)
    for t in (0.0, 10.0, 20.0):
        limits.fail("a", now=t)
    assert limits.wait("a", now=30.0) == pytest.approx(FAILURE_WINDOW_S - 30.0)
    assert limits.wait("b", now=30.0) == 0.0  # per address
    assert limits.wait("a", now=FAILURE_WINDOW_S + 0.5) == 0.0  # the oldest is a minute old
    limits.fail("a", now=FAILURE_WINDOW_S + 1)  # 10, 20, 61: the window starts at 10 again
    assert limits.wait("a", now=FAILURE_WINDOW_S + 2) == pytest.approx(10.0 + FAILURE_WINDOW_S - 62.0)


async def test_docs_need_a_key_by_default_when_keys_are_configured(r: aioredis.Redis) -> None:
    async with gateway(r, api_keys=KEYS) as gw:
        for path in ("/docs", "/openapi.json", "/redoc"):
            _error(await gw.get(path), 401, "unauthorized")
        assert (await gw.get("/openapi.json", headers=GOOD)).status_code == 200
        assert (await gw.get("/docs", headers=GOOD)).status_code == 200
        assert (await gw.get("/metrics")).status_code == 200  # /metrics: open by default
    async with gateway(r, api_keys=KEYS, docs_require_key=False) as gw:
        assert (await gw.get("/openapi.json")).status_code == 200
    async with gateway(r) as gw:  # no keys: the gateway is open, docs too
        assert (await gw.get("/openapi.json")).status_code == 200


async def test_metrics_can_require_a_key(r: aioredis.Redis) -> None:
    async with gateway(r, api_keys=KEYS, metrics_require_key=True) as gw:
        _error(await gw.get("/metrics"), 401, "unauthorized")
        _error(await gw.get("/metrics", headers=BAD), 401, "unauthorized")
        ok = await gw.get("/metrics", headers=GOOD)
    assert ok.status_code == 200 and "nightjar" in ok.text
