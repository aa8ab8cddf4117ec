"""Liveness and readiness.

- ``GET /health/live``: 200 while the process serves HTTP (no Redis call): restart it if not.
- ``GET /health``: liveness too (always 200 while up), with what it can tell of the rest:
  live workers, queued jobs and batch jobs waiting in their band (``batch_queued``), or
  ``"store": "unavailable"`` when Redis does not answer.
- ``GET /health/ready``: 200 only with at least one live, non-draining worker and Redis up;
  else 503 with Retry-After. Reports the planner's latest decision: its age, version and
  whether it is stale (workers then run a built-in fallback rule: still ready).
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from redis.exceptions import RedisError

from gateway.store import JobStore
from shared import keys

router = APIRouter()


def _store(request: Request) -> JobStore:
    store: JobStore = request.app.state.store
    return store


@router.get("/health/live")
async def live() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/health", response_model=None)
async def health(request: Request) -> dict[str, Any]:
    store = _store(request)
    try:
        workers = await store.registry.workers()
        queued = await store.queue_load()
        batch_queued = sum(
            [await store.r.xlen(keys.batch_stream(m)) for m in sorted({w.model for w in workers})]
        )
    except (RedisError, OSError):
        return {"status": "ok", "store": "unavailable"}
    # batch_queued: batch jobs waiting in their band (not yet on a job stream; never in queued's limit)
    return {"status": "ok", "workers": len(workers), "queued": queued, "batch_queued": batch_queued}


async def readiness(store: JobStore) -> tuple[bool, dict[str, Any]]:
    """Whether the gateway can answer — Redis up and a live, non-draining worker registered —
    and what it serves: the one truth of ``/health/ready`` and of the ready line that
    ``nightjar up`` / ``gateway`` print (``nightjar/ready.py``)."""
    try:
        workers = await store.registry.workers()
        queued = await store.queue_load()
        decision = await store.registry.latest_decision()
    except (RedisError, OSError) as exc:
        return False, {"reason": f"the job store (Redis) is unavailable: {type(exc).__name__}"}
    serving = [w for w in workers if not w.draining]
    now = time.time()
    planner: dict[str, Any] = {
        "policy": None,
        "decision_version": None,
        "decision_age_s": None,
        "stale": True,
    }
    if decision is not None:
        planner = {
            "policy": decision.policy,
            "decision_version": decision.version,
            "decision_age_s": round(max(0.0, now - decision.created_at), 3),
            "stale": decision.is_stale(now),
        }
    body: dict[str, Any] = {
        "workers": len(serving),
        "draining": len(workers) - len(serving),
        "queued": queued,
        "models": sorted({w.model for w in serving}),
        "drafters": sorted({d for w in serving for d in w.drafters}),
        "planner": planner,
    }
    if not serving:
        return False, {**body, "reason": "no live worker takes jobs"}
    return True, body


@router.get("/health/ready", response_model=None)
async def ready(request: Request) -> Any:
    ok, body = await readiness(_store(request))
    if not ok:
        return JSONResponse({"status": "not_ready", **body}, status_code=503, headers={"Retry-After": "5"})
    return {"status": "ready", **body}
