"""The worker's probes (worker/health.py) and their HTTP server beside /metrics."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import httpx
import pytest
import redis.asyncio as aioredis

from worker.engine.api import Engine
from worker.health import STALL_S, WorkerHealth
from worker.prompts import PromptEncoder
from worker.service import WorkerService
from worker.settings import WorkerSettings


def test_probe_states() -> None:
    h = WorkerHealth("w1", "m", 8, lambda: 3)
    assert h.probe("/health/live")[0] == 200  # loading or measuring: alive ...
    code, body = h.probe("/health")
    assert code == 503 and body["status"] == "not_ready" and body["running"] == 3  # ... not ready
    h.serving = True
    assert h.probe("/health/ready")[0] == 503  # no heartbeat has reached Redis yet
    h.beat_ok()
    assert h.probe("/health")[0] == h.probe("/health/ready")[0] == 200
    h.beat_ok_at = time.monotonic() - STALL_S - 1  # Redis unreachable for a while
    assert h.probe("/health")[0] == 503 and h.probe("/health/live")[0] == 200  # not restarted for it
    h.beat_ok()
    h.draining = True
    assert h.probe("/health")[0] == 503 and h.probe("/health/live")[0] == 200
    h.tick = time.monotonic() - STALL_S - 1  # the event loop stopped turning
    code, body = h.probe("/health/live")
    assert code == 503 and body["status"] == "stalled"


@pytest.mark.anyio
async def test_a_worker_serves_its_probes_with_its_metrics(
    r: aioredis.Redis, model_dir: Path, engine: Engine, prompts: PromptEncoder
) -> None:
    settings = WorkerSettings(model_dir=str(model_dir), worker_id="w1", model_name="tiny", metrics_port=0)
    w = WorkerService(settings, engine=engine, prompts=prompts, redis=r)
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(w.run)
            while w.metrics.http_server is None or not w.health.serving:
                await anyio.sleep(0.02)
            port = w.metrics.http_server.server_port
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                ready = await client.get("/health")
                live = await client.get("/health/live")
                metrics = await client.get("/metrics")
                missing = await client.get("/health/nope")
            w.request_stop()
    assert (
        ready.status_code == 200 and ready.json()["status"] == "ready" and ready.json()["worker_id"] == "w1"
    )
    assert live.status_code == 200 and missing.status_code == 404
    assert metrics.status_code == 200 and "nightjar:" in metrics.text
    assert w.health.draining and not w.health.serving  # drained and stopped: not ready
