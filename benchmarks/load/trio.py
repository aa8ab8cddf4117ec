"""A fresh gateway + planner + worker in this process, as ``nightjar up`` runs them.

Each configuration gets its own trio on a fresh embedded Redis (``memory://``): the
project's own ``WorkerService``, ``PlannerService`` (started with the configuration's policy)
and gateway app under ``nightjar.runner``'s uvicorn server on a free loopback port. The
benchmark client then talks to it over real HTTP, and reads the telemetry and decision
streams from the same embedded Redis.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
import redis.asyncio as aioredis

from benchmarks.load.configs import BenchConfig
from gateway.app import create_app
from gateway.settings import GatewaySettings
from nightjar.runner import http_server
from planner.service import PlannerService
from planner.settings import PlannerSettings
from shared import keys
from shared.connection import connect, reset_fake_server
from worker.engine_factory import create_engine
from worker.service import WorkerService
from worker.settings import WorkerSettings

log = logging.getLogger(__name__)

WORKER_ID = "bench-worker"


@dataclass(frozen=True)
class TrioOptions:
    model_dir: str
    max_jobs: int = 16
    max_queue: int = 100_000  # the benchmark measures queueing; it must not be refused
    engine: dict[str, Any] = field(default_factory=dict)
    threads: int | None = None  # torch threads of a worker process (in-process: the caller's)
    worker_cpus: str | None = None  # taskset list for a worker process (its own core), e.g. "1"
    other_cpus: str | None = None  # taskset list for the gateway and planner processes
    drafters: tuple[str, ...] = ()  # in-process: drafter model dirs (processes: the worker's default)
    start_timeout_s: float = 300.0


@dataclass
class Trio:
    """What the benchmark needs of running services: the gateway, and their Redis."""

    base_url: str
    redis: aioredis.Redis


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _nothing() -> None:
    pass


async def wait_for_decision(r: aioredis.Redis, deadline: float, alive: Callable[[], None] = _nothing) -> None:
    """Until the planner has published its first decision; ``alive`` raises if it died."""
    while not await r.exists(keys.DECISION_LATEST):
        alive()
        if time.monotonic() > deadline:
            raise TimeoutError("the planner published no decision")
        await anyio.sleep(0.05)


async def is_ready(client: httpx.AsyncClient, r: aioredis.Redis) -> bool:
    """The gateway answers, lists the worker, and the worker runs a planner decision."""
    try:
        health = (await client.get("/health")).json()
    except (httpx.HTTPError, ValueError):
        return False
    ack = await r.hget(keys.DECISION_ACKS, WORKER_ID)
    return bool(health.get("workers", 0) >= 1 and ack is not None and int(ack) >= 1)


async def wait_ready(
    base_url: str, r: aioredis.Redis, deadline: float, alive: Callable[[], None] = _nothing
) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=5.0) as client:
        while not await is_ready(client, r):
            alive()
            if time.monotonic() > deadline:
                raise TimeoutError("the services did not come up (gateway, worker, planner decision)")
            await anyio.sleep(0.1)


@asynccontextmanager
async def running_trio(cfg: BenchConfig, opts: TrioOptions) -> AsyncIterator[Trio]:
    """Start the three services with ``cfg``'s policy; stop them when the block ends."""
    reset_fake_server()  # a fresh embedded Redis: no jobs, state or decisions of the last run
    url = "memory://"
    r = connect(url)
    planner = PlannerService(PlannerSettings(redis_url=url, policy=cfg.policy, params=dict(cfg.params)))
    worker_settings = WorkerSettings(
        model_dir=opts.model_dir, redis_url=url, worker_id=WORKER_ID, max_jobs=opts.max_jobs,
        engine=dict(opts.engine),
    )  # fmt: skip
    # Loading the model blocks: off the event loop. The worker's own engine factory builds it.
    engine = await anyio.to_thread.run_sync(
        lambda: create_engine(opts.model_dir, drafters=opts.drafters, **opts.engine)
    )
    worker = WorkerService(worker_settings, engine=engine)
    port = free_port()
    server = http_server(
        create_app(GatewaySettings(redis_url=url, max_queue=opts.max_queue)), "127.0.0.1", port, "warning"
    )
    base_url = f"http://127.0.0.1:{port}"
    served = anyio.Event()

    async def serve() -> None:
        try:
            await server.serve()
        finally:
            served.set()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(planner.run)
            # The worker starts on the planner's first decision, not on its fallback rule.
            deadline = time.monotonic() + opts.start_timeout_s
            await wait_for_decision(r, deadline)
            tg.start_soon(worker.run)
            tg.start_soon(serve)
            await wait_ready(base_url, r, deadline)
            log.info("trio up for %s at %s", cfg.name, base_url)
            yield Trio(base_url, r)
            server.should_exit = True
            with anyio.move_on_after(10):
                await served.wait()
            tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await r.aclose()
