"""The gateway under its real uvicorn configuration on 127.0.0.1: clients that leave, slow
clients, oversized heads."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import httpx
import pytest
import redis.asyncio as aioredis

from gateway.app import create_app
from gateway.settings import GatewaySettings
from nightjar.runner import http_server
from shared import codec, jobs, keys
from shared.schemas import JobRequest, StartEvent, TokenEvent
from tests.gateway.conftest import MODEL, register_worker

pytestmark = pytest.mark.anyio


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def served(r: aioredis.Redis, **settings: object) -> AsyncIterator[int]:
    await register_worker(r)
    port = _free_port()
    server = http_server(create_app(GatewaySettings(**settings), redis=r), "127.0.0.1", port, "warning")  # type: ignore[arg-type]
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve)
        with anyio.fail_after(10):
            while not server.started:
                await anyio.sleep(0.01)
        yield port
        server.should_exit = True


async def _wait_for(check, what: str, timeout_s: float = 10) -> None:  # type: ignore[no-untyped-def]
    with anyio.move_on_after(timeout_s):
        while not await check():
            await anyio.sleep(0.02)
        return
    raise AssertionError(f"timed out waiting for {what}")


async def _queued_ids(r: aioredis.Redis) -> list[str]:
    return [
        codec.decode_as(f[codec.FIELD], JobRequest).job_id for _, f in await r.xrange(keys.jobs_stream(MODEL))
    ]


def _post(path: str, body: dict) -> bytes:
    raw = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(raw)}\r\n\r\n"
    )
    return head.encode() + raw


async def test_a_client_that_leaves_cancels_its_job(r: aioredis.Redis) -> None:
    async with served(r) as port:
        for body in ({"prompt": "x"}, {"prompt": "y", "stream": True}):  # no worker answers
            sock = await anyio.connect_tcp("127.0.0.1", port)
            await sock.send(_post("/v1/completions", body))
            before = len(await _queued_ids(r))
            await _wait_for(lambda n=before: _more_jobs(r, n), "the job to be queued")
            await sock.aclose()
            job_id = (await _queued_ids(r))[-1]
            await _wait_for(
                lambda j=job_id: r.exists(keys.job_cancel(MODEL, j)), "the cancel of a left client's job"
            )


async def _more_jobs(r: aioredis.Redis, n: int) -> bool:
    return len(await _queued_ids(r)) > n


async def _closed_within(sock: anyio.abc.SocketStream, seconds: float) -> bytes:
    """What the server sends before it closes the connection (fails if it stays open)."""
    got = b""
    with anyio.fail_after(seconds):
        while True:
            try:
                chunk = await sock.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionResetError):
                return got
            got += chunk


async def test_slow_headers_are_cut_off(r: aioredis.Redis) -> None:
    async with served(r, header_timeout_s=0.5) as port:
        sock = await anyio.connect_tcp("127.0.0.1", port)
        await sock.send(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
        assert await _closed_within(sock, 5) == b""
        idle = await anyio.connect_tcp("127.0.0.1", port)  # says nothing at all
        assert await _closed_within(idle, 5) == b""
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            assert (await client.get("/health/live")).status_code == 200  # the server is fine


async def test_a_slow_body_is_a_408(r: aioredis.Redis) -> None:
    async with served(r, body_timeout_s=0.5) as port:
        sock = await anyio.connect_tcp("127.0.0.1", port)
        await sock.send(_post("/v1/jobs", {"prompt": "x" * 100})[:-50])  # the body's end never comes
        reply = await _closed_within(sock, 5)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408") and json.loads(body)["error"]["code"] == "timeout"
    assert await r.xlen(keys.jobs_stream(MODEL)) == 0


async def test_a_declared_oversized_body_is_refused_unread(r: aioredis.Redis) -> None:
    async with served(r, max_body_bytes=1024) as port:
        sock = await anyio.connect_tcp("127.0.0.1", port)
        await sock.send(
            b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 999999999\r\n\r\n"
        )
        with anyio.fail_after(5):
            reply = await sock.receive()
        await sock.aclose()
    assert reply.startswith(b"HTTP/1.1 413") and b"payload_too_large" in reply


async def test_a_client_that_reads_nothing_is_dropped_and_its_job_cancelled(r: aioredis.Redis) -> None:
    async with served(r, send_timeout_s=0.5, keepalive_s=0.2) as port:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills at once
        sock.connect(("127.0.0.1", port))
        sock.sendall(_post("/v1/completions", {"prompt": "x", "stream": True}))
        await _wait_for(lambda: _more_jobs(r, 0), "the job to be queued")
        (job_id,) = await _queued_ids(r)
        big = "y" * 256 * 1024
        async with r.pipeline(transaction=False) as pipe:  # far more than any socket buffer holds
            events = [StartEvent(job_id=job_id, worker_id="w")]
            events += [TokenEvent(job_id=job_id, index=i, token_ids=[1], text=big) for i in range(64)]
            jobs.add_events(pipe, job_id, events, model=MODEL)
            await pipe.execute()
        await _wait_for(
            lambda: r.exists(keys.job_cancel(MODEL, job_id)), "the cancel of a non-reading client's job"
        )
        sock.close()
