"""A seeded corpus of hostile requests: mutations of valid bodies, junk bytes, junk ids.
Every answer is below 500 and every error is OpenAI's JSON shape."""

from __future__ import annotations

import json
import os
import random
from typing import Any

import anyio
import pytest
import redis.asyncio as aioredis

from tests.gateway.conftest import gateway, scripted_worker

pytestmark = pytest.mark.anyio

N_REQUESTS = int(os.environ.get("NIGHTJAR_FUZZ_REQUESTS", "1500"))  # 10000 for a long run

VALID: list[tuple[str, dict[str, Any]]] = [
    ("/v1/jobs", {"prompt": "hi", "params": {"max_tokens": 4, "temperature": 0.5, "stop": ["x"]}}),
    ("/v1/jobs", {"prompt_token_ids": [1, 2, 3], "priority": 1}),
    ("/v1/jobs", {"messages": [{"role": "user", "content": "hi"}], "id": "abc"}),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 3, "seed": 1, "stop": "\n", "top_k": 2}),
    ("/v1/completions", {"prompt": [1, 2], "stream": True, "stream_options": {"include_usage": True}}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 2}),
    ("/v1/chat/completions", {"messages": [{"role": "system", "content": [{"type": "text", "text": "a"}]}]}),
    ("/admin/policy", {"policy": "static", "params": {"gamma": 2}}),
]

# Raw JSON fragments (NaN and Infinity are not JSON, but Python's parser takes them).
HOSTILE = [
    "0", "-1", "1e400", "-1e400", "NaN", "Infinity", "-Infinity", "1e-400", "5e-324",
    str(2**63), str(2**64), str(2**64 + 1), str(-(2**64)), "1" * 400,
    '""', '"\\ud800"', '"\\udfff\\ud800"', '"\\u0000"', json.dumps("x" * 100_000),
    "null", "true", "[]", "{}", "[" * 300 + "]" * 300, '{"a":' * 200 + "1" + "}" * 200,
    "[1, 2, " + str(2**70) + "]", '["\\ud800"]', '[""]', '[{"role": "tool"}]',
    '[{"role": "user", "content": 5}]', '{"include_usage": "yes"}', '"user"', "1.5", "-0.0",
]  # fmt: skip


def _mutate(rng: random.Random, body: dict[str, Any]) -> str:
    """The body as JSON text with one field (maybe nested) replaced by a hostile fragment."""
    marker = "\x00HOSTILE\x00"
    target: dict[str, Any] = json.loads(json.dumps(body))
    node = target
    while True:
        keys = [*node.keys(), "extra_field"]
        key = rng.choice(keys)
        if isinstance(node.get(key), dict) and rng.random() < 0.5:
            node = node[key]
            continue
        node[key] = marker
        break
    return json.dumps(target).replace(json.dumps(marker), rng.choice(HOSTILE))


def _junk(rng: random.Random) -> bytes:
    return bytes(rng.randrange(256) for _ in range(rng.randrange(64)))


def _check(status: int, body: bytes, what: str) -> None:
    assert status < 500, f"{what}: {status} {body[:300]!r}"
    if status >= 400:
        err = json.loads(body)["error"]
        assert set(err) == {"message", "type", "param", "code"}, what


async def test_hostile_corpus_gets_no_5xx(r: aioredis.Redis) -> None:
    rng = random.Random(20261201)
    counts: dict[int, int] = {}
    async with (
        gateway(r, admin_token="t", max_queue=100_000, request_timeout_s=5) as gw,
        scripted_worker(r),
    ):
        with anyio.fail_after(240):
            for i in range(N_REQUESTS):
                route, body = rng.choice(VALID)
                headers = {"content-type": "application/json", "Authorization": "Bearer t"}
                roll = rng.random()
                if roll < 0.8:
                    content = _mutate(rng, body).encode()
                elif roll < 0.9:
                    content = _junk(rng)
                else:
                    content = json.dumps(body).encode()
                    headers["Idempotency-Key"] = rng.choice(["k", "\t", "x" * 300, str(i)])
                resp = await gw.post(route, content=content, headers=headers)
                _check(resp.status_code, resp.content, f"POST {route} {content[:200]!r}")
                counts[resp.status_code] = counts.get(resp.status_code, 0) + 1
            for junk_id in ("a:events", "..", "%00", "x" * 500, "%F0%9F%98%80", "abc%3Aevents", "0-0"):
                for method in ("GET", "DELETE"):
                    for suffix in ("", "/events"):
                        resp = await gw.request(method, f"/v1/jobs/{junk_id}{suffix}")
                        _check(resp.status_code, resp.content, f"{method} {junk_id}{suffix}")
            real = (await gw.post("/v1/jobs", json={"prompt": "x"})).json()["id"]
            for last in (b"nope", "\ud800".encode("utf-8", "surrogatepass"), b"9" * 50 + b"-0", b"\xff"):
                resp = await gw.get(f"/v1/jobs/{real}/events", headers={"Last-Event-ID": last})
                assert resp.status_code == 400, last
                _check(resp.status_code, resp.content, f"Last-Event-ID {last!r}")
    print("statuses:", dict(sorted(counts.items())))
    assert counts.get(400, 0) > N_REQUESTS // 2  # most mutations are refused ...
    assert counts.get(200, 0) + counts.get(202, 0) > 50  # ... and the harmless ones served
