"""Hostile input: every answer is JSON in OpenAI's shape, never a 5xx, never a job enqueued."""

from __future__ import annotations

import json

import httpx
import pytest
import redis.asyncio as aioredis
from fastapi import APIRouter

from gateway.app import create_app
from gateway.settings import GatewaySettings
from shared import codec, keys
from shared.schemas import TEMPERATURE_FLOOR, JobRequest
from tests.gateway.conftest import MODEL, gateway, register_worker

pytestmark = pytest.mark.anyio

HUGE = [2**63, 2**64, 2**64 + 1, -(2**64), 10**30]


def _is_openai_error(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


async def _no_job(r: aioredis.Redis) -> None:
    assert await r.xlen(keys.jobs_stream(MODEL)) == 0


async def test_a_tiny_temperature_is_raised_to_the_floor(r: aioredis.Redis) -> None:
    async with gateway(r) as gw:
        for t in (1e-300, 5e-324, 1e-45, 1e-8):
            resp = await gw.post("/v1/jobs", json={"prompt": "x", "params": {"temperature": t}})
            assert resp.status_code == 202
        resp = await gw.post("/v1/jobs", json={"prompt": "x", "params": {"temperature": 0}})
    temps = [
        codec.decode_as(f[codec.FIELD], JobRequest).params.temperature
        for _, f in await r.xrange(keys.jobs_stream(MODEL))
    ]
    assert temps == [TEMPERATURE_FLOOR] * 4 + [0.0]  # 0 stays greedy


@pytest.mark.parametrize("value", HUGE)
@pytest.mark.parametrize(
    "route, make",
    [
        ("/v1/jobs", lambda v: {"prompt": "x", "params": {"seed": v}}),
        ("/v1/jobs", lambda v: {"prompt": "x", "params": {"top_k": v}}),
        ("/v1/jobs", lambda v: {"prompt": "x", "params": {"max_tokens": v}}),
        ("/v1/jobs", lambda v: {"prompt": "x", "priority": v}),
        ("/v1/jobs", lambda v: {"prompt_token_ids": [1, v]}),
        ("/v1/completions", lambda v: {"prompt": [1, v]}),
        ("/v1/completions", lambda v: {"prompt": "x", "max_tokens": v}),
        ("/v1/completions", lambda v: {"prompt": "x", "seed": v}),
        ("/v1/completions", lambda v: {"prompt": "x", "top_k": v}),
        ("/v1/completions", lambda v: {"prompt": "x", "priority": v}),
        ("/v1/chat/completions", lambda v: {"messages": [{"role": "user", "content": "x"}], "max_tokens": v}),
        (
            "/v1/chat/completions",
            lambda v: {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": v},
        ),
    ],
)
async def test_huge_integers_are_400s(r: aioredis.Redis, route: str, make, value: int) -> None:  # type: ignore[no-untyped-def]
    async with gateway(r) as gw:
        resp = await gw.post(route, json=make(value))
    err = _is_openai_error(resp, 400)
    assert err["code"] == "bad_request" and err["param"]
    await _no_job(r)


LONE = "a\ud800b"


@pytest.mark.parametrize(
    "route, body",
    [
        ("/v1/jobs", {"prompt": LONE}),
        ("/v1/jobs", {"messages": [{"role": "user", "content": LONE}]}),
        ("/v1/jobs", {"prompt": "x", "params": {"stop": [LONE]}}),
        ("/v1/completions", {"prompt": LONE}),
        ("/v1/completions", {"prompt": [LONE]}),
        ("/v1/completions", {"prompt": "x", "stop": LONE}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": LONE}]}),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "text", "text": LONE}]}]},
        ),
    ],
)
async def test_lone_surrogates_are_400s(r: aioredis.Redis, route: str, body: dict) -> None:
    raw = json.dumps(body).encode()  # ASCII JSON: the surrogate travels as the escape \ud800
    async with gateway(r) as gw:
        resp = await gw.post(route, content=raw, headers={"content-type": "application/json"})
    assert _is_openai_error(resp, 400)["code"] == "bad_request"
    await _no_job(r)


@pytest.mark.parametrize(
    "params",
    [
        {"x": [[[[[[[[[[1]]]]]]]]]]},
        {"x": 2**64},
        {"x": LONE},
        {"x": list(range(20_000))},
        "not an object",
    ],
)
async def test_hostile_admin_params_are_400s(r: aioredis.Redis, params: object) -> None:
    raw = json.dumps({"policy": "static", "params": params}).encode()
    async with gateway(r, admin_token="t") as gw:
        resp = await gw.post(
            "/admin/policy",
            content=raw,
            headers={"content-type": "application/json", "Authorization": "Bearer t"},
        )
        deep = "[" * 100_000 + "]" * 100_000
        deeper = await gw.post(
            "/admin/policy",
            content=f'{{"policy": "static", "params": {{"x": {deep}}}}}',
            headers={"content-type": "application/json", "Authorization": "Bearer t"},
        )
    assert _is_openai_error(resp, 400)["param"] == "params" or params == "not an object"
    _is_openai_error(deeper, 400)
    assert await r.xlen(keys.PLANNER_CONTROL_STREAM) == 0


@pytest.mark.parametrize(
    "job_id", ["abc:events", "abc:cancel", "x" * 65, "a b", "..", "%3Aevents", "{x}", "ab\u00e9"]
)
async def test_malformed_job_ids_are_unknown_jobs(r: aioredis.Redis, job_id: str) -> None:
    async with gateway(r) as gw:
        real = (await gw.post("/v1/jobs", json={"prompt": "x"})).json()["id"]
        # The hash and the events stream of a real job must never be read as another job.
        for jid in (job_id, f"{real}:events", f"{real}:cancel"):
            for method, path in (
                ("GET", f"/v1/jobs/{jid}"),
                ("GET", f"/v1/jobs/{jid}/events"),
                ("DELETE", f"/v1/jobs/{jid}"),
            ):
                resp = await gw.request(method, path)
                if resp.status_code == 404 and "error" in resp.json():
                    assert resp.json()["error"]["code"] in ("job_not_found", "not_found"), (method, path)
                else:
                    raise AssertionError(f"{method} {path}: {resp.status_code} {resp.text}")
    assert await r.get(keys.job_cancel(MODEL, real)) is None


async def test_a_bad_client_chosen_id_is_a_400(r: aioredis.Redis) -> None:
    async with gateway(r) as gw:
        resp = await gw.post("/v1/jobs", json={"id": "a:events", "prompt": "x"})
    assert _is_openai_error(resp, 400)["param"] == "id"
    await _no_job(r)


async def test_nan_and_infinity_are_400s(r: aioredis.Redis) -> None:
    async with gateway(r) as gw:
        for raw in ('{"prompt": "x", "temperature": NaN}', '{"prompt": "x", "top_p": Infinity}'):
            resp = await gw.post("/v1/completions", content=raw, headers={"content-type": "application/json"})
            _is_openai_error(resp, 400)
    await _no_job(r)


async def test_an_unexpected_exception_is_a_json_500(r: aioredis.Redis) -> None:
    await register_worker(r)
    app = create_app(GatewaySettings(), redis=r)
    boom = APIRouter()

    @boom.get("/boom")
    async def _boom() -> None:
        raise RuntimeError("kaput")

    app.include_router(boom)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as gw:
        resp = await gw.get("/boom")
    err = _is_openai_error(resp, 500)
    assert err["code"] == "internal" and err["type"] == "server_error" and "kaput" not in err["message"]


async def test_body_size_limit_is_a_413(r: aioredis.Redis) -> None:
    async with gateway(r, max_body_bytes=1000) as gw:
        big = await gw.post("/v1/jobs", json={"prompt": "x" * 2000})
        ok = await gw.post("/v1/jobs", json={"prompt": "x" * 500})

        async def chunks():  # type: ignore[no-untyped-def]
            for _ in range(5):
                yield b" " * 400  # no Content-Length: counted as it arrives

        chunked = await gw.post("/v1/jobs", content=chunks(), headers={"content-type": "application/json"})
    assert _is_openai_error(big, 413)["code"] == "payload_too_large"
    assert _is_openai_error(chunked, 413)["code"] == "payload_too_large"
    assert ok.status_code == 202
    assert await r.xlen(keys.jobs_stream(MODEL)) == 1
