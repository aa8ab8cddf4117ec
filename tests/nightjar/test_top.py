"""``nightjar top`` in a scripted terminal (a pty) against a running deployment on the real
Redis: gateway, planner and a worker (the bundled target, speculating with γ = 2) run in this
process on database 11; ``top`` runs as its own process, as an operator would run it."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import httpx
import pytest
import redis

from gateway.app import create_app
from gateway.settings import GatewaySettings
from nightjar.runner import http_server, run_services
from nightjar.top import CLEAR
from planner.service import PlannerService
from planner.settings import PlannerSettings
from tests.e2e.conftest import free_port, poll
from worker.service import WorkerService
from worker.settings import WorkerSettings

pytestmark = [pytest.mark.redis, pytest.mark.anyio]

REDIS_URL = "redis://127.0.0.1:6379/11"
TARGET = Path(__file__).resolve().parents[2] / "models" / "nj-target"
WORKER = "top-w1"


def _top(*args: str) -> list[str]:
    return [sys.executable, "-m", "nightjar", "top", "--redis-url", REDIS_URL, *args]


def _live_frames(frames: int, timeout_s: float) -> tuple[list[str], int]:
    """Run ``top`` live in a pty until it drew ``frames`` screens naming the worker, then
    Ctrl-C it; the screens and its exit code."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        _top("--interval", "0.3"), stdin=slave, stdout=slave, stderr=slave, close_fds=True
    )
    os.close(slave)
    out = b""
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            screens = out.decode(errors="replace").split(CLEAR)[1:]
            if sum(WORKER in s for s in screens[:-1]) >= frames:  # complete screens only
                break
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    out += os.read(master, 65536)
                except OSError:  # the child closed the terminal
                    break
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    return out.decode(errors="replace").split(CLEAR)[1:], code


@pytest.mark.skipif(not (TARGET / "config.json").is_file(), reason="bundled model missing")
async def test_top_shows_a_running_deployment_live_and_once() -> None:
    sync = redis.Redis.from_url(REDIS_URL)
    sync.flushdb()
    port = free_port()
    worker = WorkerService(
        WorkerSettings(
            model_dir=str(TARGET), redis_url=REDIS_URL, worker_id=WORKER, block_ms=200, drafters=[]
        )
    )
    planner = PlannerService(
        PlannerSettings(redis_url=REDIS_URL, policy="static", block_ms=200, params={"gamma": 2})
    )
    server = http_server(create_app(GatewaySettings(redis_url=REDIS_URL)), "127.0.0.1", port, "warning")
    try:
        with anyio.fail_after(180):
            async with anyio.create_task_group() as tg:
                tg.start_soon(run_services, [worker.run, planner.run], server)
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as gw:
                    await poll(lambda: _serving(gw), 60, "the worker to register")
                    for i in range(4):
                        body = {"prompt": f"the the the {i} the the", "max_tokens": 24, "temperature": 0}
                        assert (await gw.post("/v1/completions", json=body)).status_code == 200
                    once = await anyio.to_thread.run_sync(
                        lambda: subprocess.run(_top("--once"), capture_output=True, text=True, timeout=60)
                    )
                    screens, code = await anyio.to_thread.run_sync(_live_frames, 2, 60.0)
                server.should_exit = True
    finally:
        sync.flushdb()
        sync.close()
    assert once.returncode == 0, once.stderr
    snap = once.stdout
    assert CLEAR not in snap  # a snapshot is plain text
    for part in (WORKER, "nj-target", "policy static", "decision v", "γ by batch", "≥1:γ2", "ngram"):
        assert part in snap, (part, snap)
    assert code == 0
    complete = [s for s in screens[:-1] if WORKER in s]
    assert len(complete) >= 2 and all("decision v" in s for s in complete)


async def _serving(gw: httpx.AsyncClient) -> bool:
    try:
        return bool((await gw.get("/health")).json().get("workers"))
    except httpx.TransportError:
        return False
