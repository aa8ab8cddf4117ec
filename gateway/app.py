"""The gateway application: job API, OpenAI-compatible routes, admin, health, the chat page.
No model here.

Middleware, outermost first: ``CatchAll`` (no plain-text 500), ``Limits`` (requests in
flight, body size and deadlines), ``Guard`` (API keys and rate limits of /v1).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import redis.asyncio as aioredis
from fastapi import FastAPI

from gateway import errors, health, routes_admin, routes_batches, routes_jobs, routes_openai, ui, webhooks
from gateway.auth import Guard
from gateway.limits import Limits
from gateway.settings import GatewaySettings
from gateway.store import JobStore
from shared.connection import connect

log = logging.getLogger("nightjar.gateway")


def create_app(settings: GatewaySettings, redis: aioredis.Redis | None = None) -> FastAPI:
    """The ASGI app; it uses ``redis`` when given (and leaves it open), else its own client."""
    client = redis if redis is not None else connect(settings.redis_url)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if not settings.api_keys:
            log.warning(
                "no API key configured (--api-key / NIGHTJAR_API_KEYS): every /v1 route is open "
                "and every client sees every job"
            )
        async with anyio.create_task_group() as tg:
            tg.start_soon(webhooks.Deliverer(app.state.store).run)  # webhook deliveries
            yield
            tg.cancel_scope.cancel()
        if redis is None:
            await client.aclose()

    app = FastAPI(title="Nightjar gateway", lifespan=lifespan)
    app.state.settings = settings
    app.state.store = JobStore(client, settings)
    errors.install(app)
    app.include_router(health.router)
    app.include_router(routes_jobs.router)
    app.include_router(routes_openai.router)
    app.include_router(routes_batches.router)
    app.include_router(routes_admin.router)
    app.include_router(ui.router)  # the chat page (gateway/ui.py)
    # add_middleware wraps what is there: the last added runs first.
    app.add_middleware(Guard, settings=settings)
    app.add_middleware(Limits, settings=settings)
    app.add_middleware(errors.CatchAll)
    from gateway import metrics  # request ids, counts, /metrics: outermost (gateway/metrics.py)

    metrics.install(app)
    return app
