"""The real gateway (uvicorn on a free loopback port) with an embedded worker and planner on
the embedded store, for the compatibility tests: ``async with served(model_dir) as base``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx
import openai

from gateway.app import create_app
from gateway.settings import GatewaySettings
from nightjar.runner import http_server, run_services
from planner.service import PlannerService
from planner.settings import PlannerSettings
from shared.connection import reset_fake_server
from tests.e2e.conftest import free_port, poll
from worker.service import WorkerService
from worker.settings import WorkerSettings


async def ready(base: str) -> bool:
    """The gateway answers /health/ready with 200 (a live worker, a planner decision)."""
    try:
        async with httpx.AsyncClient() as c:
            return (await c.get(base + "/health/ready")).status_code == 200
    except httpx.TransportError:
        return False


def sdk(base: str) -> openai.AsyncOpenAI:
    """The official client for the served gateway, with no retries (a failure shows at once)."""
    return openai.AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=60)


@asynccontextmanager
async def served(model_dir: Path, timeout_s: float = 180) -> AsyncIterator[str]:
    """Serve ``model_dir``; yield the base URL once ready; stop everything on exit."""
    reset_fake_server()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    worker = WorkerService(
        WorkerSettings(model_dir=str(model_dir), worker_id="compat", block_ms=200, engine={"num_blocks": 256})
    )
    planner = PlannerService(PlannerSettings(policy="static", block_ms=200))
    server = http_server(create_app(GatewaySettings()), "127.0.0.1", port, "warning")
    with anyio.fail_after(timeout_s):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run_services, [worker.run, planner.run], server)
            await poll(lambda: ready(base), 60, "the gateway and its worker")
            try:
                yield base
            finally:
                server.should_exit = True
