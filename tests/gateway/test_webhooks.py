"""Webhooks: signed, retried with backoff, delivered at least once (receivers on loopback)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest
import redis.asyncio as aioredis

from gateway import webhooks
from shared import keys
from tests.gateway.conftest import gateway, scripted_worker

pytestmark = pytest.mark.anyio
SECRET = "s3cret"


@asynccontextmanager
async def receiver(statuses: list[int]) -> AsyncIterator[tuple[str, list[tuple[dict[str, str], bytes]]]]:
    """An HTTP server on 127.0.0.1 answering each POST with the next status of ``statuses``
    (then 200); yields its URL and what it received."""
    got: list[tuple[dict[str, str], bytes]] = []

    async def handle(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            data = b""
            while b"\r\n\r\n" not in data:
                data += await stream.receive()
            head, _, body = data.partition(b"\r\n\r\n")
            lines = head.decode().split("\r\n")
            headers = {k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
            while len(body) < int(headers.get("content-length", "0")):
                body += await stream.receive()
            got.append((headers, body))
            status = statuses.pop(0) if statuses else 200
            await stream.send(
                f"HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".encode()
            )

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, handle)
        yield f"http://127.0.0.1:{port}/hook", got
        tg.cancel_scope.cancel()


async def _deliver_until(d: webhooks.Deliverer, r: aioredis.Redis, done: object) -> None:
    """Run delivery rounds (due times forced to now: no waiting out the backoff)."""
    with anyio.fail_after(20):
        while not done():  # type: ignore[operator]
            for member in await r.zrange(keys.WEBHOOKS, 0, -1):
                await r.zadd(keys.WEBHOOKS, {member: 0})
            await d.once()
            await anyio.sleep(0.01)


async def test_a_jobs_webhook_is_signed_retried_and_delivered(r: aioredis.Redis) -> None:
    async with (
        receiver([500, 503]) as (url, got),
        gateway(r, webhook_secret=SECRET) as gw,
        scripted_worker(r),
    ):
        job_id = (await gw.post("/v1/jobs", json={"prompt": "x", "webhook_url": url})).json()["id"]
        d = webhooks.Deliverer(gw._transport.app.state.store)  # type: ignore[attr-defined]
        await _deliver_until(d, r, lambda: len(got) >= 3)
        assert await r.zcard(keys.WEBHOOKS) == 0  # delivered: nothing left to send
    assert len(got) == 3  # two failures, then the delivery
    headers, body = got[-1]
    event = json.loads(body)
    assert event["type"] == "job.finished" and event["data"]["id"] == job_id
    assert event["data"]["result"]["text"] == "Hello"
    assert headers["webhook-id"] == f"job:{job_id}"
    assert webhooks.verify(SECRET, body, headers["webhook-signature"])
    assert not webhooks.verify("other", body, headers["webhook-signature"])


async def test_a_failing_receiver_is_given_up_after_max_attempts(r: aioredis.Redis) -> None:
    async with (
        receiver([500] * 10) as (url, got),
        gateway(r, webhook_max_attempts=3) as gw,
        scripted_worker(r),
    ):
        await gw.post("/v1/jobs", json={"prompt": "x", "webhook_url": url})
        d = webhooks.Deliverer(gw._transport.app.state.store)  # type: ignore[attr-defined]

        async def empty() -> bool:
            return await r.zcard(keys.WEBHOOKS) == 0

        with anyio.fail_after(20):
            while not await empty():
                for member in await r.zrange(keys.WEBHOOKS, 0, -1):
                    await r.zadd(keys.WEBHOOKS, {member: 0})
                await d.once()
    assert len(got) == 3 and "webhook-signature" not in got[0][0]  # no secret: unsigned


async def test_backoff_and_claims(r: aioredis.Redis) -> None:
    async with gateway(r) as gw:
        store = gw._transport.app.state.store  # type: ignore[attr-defined]
        await webhooks.register(store, "job", "nope", "http://127.0.0.1:9/x", "")
        first, second = webhooks.Deliverer(store), webhooks.Deliverer(store)
        claimed = await first._claim(keys=[keys.WEBHOOKS], args=[1e12, 1e12 + 30, 10])
        assert claimed == [b"job:nope"]
        assert await second._claim(keys=[keys.WEBHOOKS], args=[1e12 - 1, 1e12 + 30, 10]) == []
    with pytest.raises(Exception, match="webhook_url"):
        webhooks.check_url("file:///etc/passwd")
