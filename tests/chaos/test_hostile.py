"""(f) The hostile-input corpus (tests/chaos/hostile.py): never a 5xx, always a JSON body
(an OpenAI-shaped error for every 4xx), no hang, and every service still alive after."""

from __future__ import annotations

import json
import socket
from collections import Counter
from dataclasses import dataclass

import anyio
import httpx
import pytest
import redis.asyncio as aioredis

from tests.chaos.cluster import Cluster
from tests.chaos.hostile import Req, corpus
from tests.chaos.jobs import submit, wait_all_ended

pytestmark = [pytest.mark.chaos, pytest.mark.redis, pytest.mark.anyio]

CONCURRENCY = 16
REQUEST_TIMEOUT_S = 30.0


@dataclass
class Outcome:
    req: Req
    status: int | None
    problem: str | None  # None: acceptable


def judge(req: Req, resp: httpx.Response) -> str | None:
    """What is wrong with this answer, if anything."""
    if resp.status_code >= 500:
        return f"{resp.status_code}: {resp.text[:200]!r}"
    ctype = resp.headers.get("content-type", "")
    if resp.status_code == 200 and ctype.startswith("text/event-stream"):
        return None
    if req.method == "HEAD" or 300 <= resp.status_code < 400:  # no body to judge (a redirect)
        return None
    try:
        body = json.loads(resp.content)
    except ValueError:
        return f"{resp.status_code} not JSON ({ctype}): {resp.text[:120]!r}"
    if resp.status_code >= 400:
        err = body.get("error") if isinstance(body, dict) else None
        if not (isinstance(err, dict) and isinstance(err.get("message"), str) and "type" in err):
            return f"{resp.status_code} not an OpenAI-shaped error: {resp.text[:200]!r}"
    return None


async def send_all(base_url: str, reqs: list[Req]) -> list[Outcome]:
    out: list[Outcome] = []
    limit = anyio.Semaphore(CONCURRENCY)
    async with httpx.AsyncClient(base_url=base_url, timeout=REQUEST_TIMEOUT_S) as client:

        async def one(req: Req) -> None:
            async with limit:
                headers = [(k.encode(), v.encode("latin-1", "replace")) for k, v in req.headers.items()]
                try:
                    resp = await client.request(req.method, req.path, content=req.body, headers=headers)
                except httpx.TimeoutException:
                    out.append(Outcome(req, None, f"no answer in {REQUEST_TIMEOUT_S}s"))
                    return
                except httpx.TransportError as exc:
                    out.append(Outcome(req, None, f"transport error {type(exc).__name__}: {exc}"))
                    return
                out.append(Outcome(req, resp.status_code, judge(req, resp)))

        async with anyio.create_task_group() as tg:
            for req in reqs:
                tg.start_soon(one, req)
    return out


async def test_hostile_corpus_gets_no_5xx(healthy: Cluster, gw: httpx.AsyncClient, r: aioredis.Redis) -> None:
    c = healthy
    job_id = await submit(gw, "A real job for the hostile requests", max_tokens=2)
    await wait_all_ended(r, [job_id], 60, "the real job")
    reqs = corpus(job_id, c.admin_token)
    started = anyio.current_time()
    with anyio.fail_after(180):
        outcomes = await send_all(c.url, reqs)
    took = anyio.current_time() - started
    bad = [o for o in outcomes if o.problem]
    statuses = Counter(o.status for o in outcomes)
    five = sum(1 for o in outcomes if o.status is not None and o.status >= 500)
    print(
        f"\n[chaos f] {len(outcomes)} hostile requests in {took:.1f}s: 5xx={five} problems={len(bad)} "
        f"statuses={dict(sorted(statuses.items(), key=str))}"
    )
    for o in bad[:40]:
        print(f"  {o.req.note[:90]} -> {o.problem}")
    assert not c.dead(), c.logs_of_dead()
    assert not bad, (
        f"{len(bad)} of {len(outcomes)} answers wrong; first: {[(o.req.note, o.problem) for o in bad[:10]]}"
    )
    # The gateway still serves real work afterwards.
    after = await submit(gw, "Still serving after the corpus", max_tokens=2)
    await wait_all_ended(r, [after], 60, "a job after the hostile corpus")


TEN_MB = 10 * 1024 * 1024


def _raw_exchange(port: int, head: bytes) -> bytes:
    """Send ``head`` (a request without its body) and read until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        return data


async def test_body_over_the_limit_is_413(healthy: Cluster) -> None:
    c = healthy
    # Declared too large: answered from the headers alone.
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {TEN_MB}\r\n\r\n"
    ).encode()
    raw = await anyio.to_thread.run_sync(_raw_exchange, c.port, head)
    status_line, _, rest = raw.partition(b"\r\n")
    assert b" 413 " in status_line, raw[:300]
    body = json.loads(rest.partition(b"\r\n\r\n")[2])
    assert body["error"]["code"] == "payload_too_large"
    # Really sent: the client must see the 413 too, not a connection reset mid-upload.
    seen: dict[str, str] = {}
    async with httpx.AsyncClient(base_url=c.url, timeout=REQUEST_TIMEOUT_S) as client:
        for route in ("/v1/jobs", "/v1/completions", "/v1/chat/completions"):
            big = b'{"prompt": "' + b"a" * TEN_MB + b'"}'
            try:
                resp = await client.post(route, content=big, headers={"content-type": "application/json"})
                seen[route] = f"{resp.status_code} {resp.json().get('error', {}).get('code')}"
            except httpx.TransportError as exc:
                seen[route] = f"transport error {type(exc).__name__}"
    print(f"\n[chaos f] 10 MB bodies: {seen}")
    assert not c.dead(), c.logs_of_dead()
    assert all(v == "413 payload_too_large" for v in seen.values()), seen
