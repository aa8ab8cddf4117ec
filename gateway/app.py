"""The gateway application: job API, OpenAI-compatible routes, admin, health. No model here."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import redis.asyncio as aioredis
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from redis.exceptions import RedisError

from gateway import errors, routes_admin, routes_jobs, routes_openai
from gateway.settings import GatewaySettings
from gateway.store import JobStore
from shared.connection import connect


def create_app(settings: GatewaySettings, redis: aioredis.Redis | None = None) -> FastAPI:
    """The ASGI app; it uses ``redis`` when given (and leaves it open), else its own client."""
    client = redis if redis is not None else connect(settings.redis_url)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        if redis is None:
            await client.aclose()

    app = FastAPI(title="Nightjar gateway", lifespan=lifespan)
    app.state.settings = settings
    app.state.store = JobStore(client, settings.max_queue)
    errors.install(app)
    app.include_router(routes_jobs.router)
    app.include_router(routes_openai.router)
    app.include_router(routes_admin.router)

    @app.get("/health", response_model=None)
    async def health(request: Request) -> Any:
        store: JobStore = request.app.state.store
        try:
            await store.r.ping()
            workers = await store.workers(settings.worker_timeout_s)
            queued = await store.queue_load()
        except (RedisError, OSError) as exc:
            return JSONResponse({"status": "unavailable", "error": str(exc)}, status_code=503)
        return {"status": "ok", "workers": len(workers), "queued": queued}

    return app
