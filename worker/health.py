"""The worker's probes, served with /metrics on ``--metrics-port`` (Kubernetes' liveness and
readiness; deploy/k8s).

- ``/health/live``: 200 while the event loop turns (``ticking`` ran within ``STALL_S``),
  whatever Redis does: a worker waiting out a Redis outage must not be restarted.
- ``/health`` and ``/health/ready``: 200 once the worker serves (engine built, profile
  measured, registered), while it is not draining and its last heartbeat reached Redis
  within ``STALL_S``; else 503. Answered from the start, so a worker still loading or
  measuring is "not ready", not a refused connection.

``probe`` runs on the HTTP server's thread: it only reads what the service's loop writes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio

STALL_S = 30.0  # an event loop (a heartbeat to Redis) silent this long is not alive (ready)


@dataclass
class WorkerHealth:
    worker_id: str
    model: str
    max_jobs: int
    running: Callable[[], int]  # jobs held now
    serving: bool = False
    draining: bool = False
    tick: float = field(default_factory=time.monotonic)  # the loop's last turn of ``ticking``
    beat_ok_at: float | None = None  # the last heartbeat Redis took

    def beat_ok(self) -> None:
        self.beat_ok_at = time.monotonic()

    async def ticking(self) -> None:
        while True:
            self.tick = time.monotonic()
            await anyio.sleep(1.0)

    def probe(self, path: str) -> tuple[int, dict[str, Any]]:
        now = time.monotonic()
        loop_age = now - self.tick
        redis_age = None if self.beat_ok_at is None else now - self.beat_ok_at
        body: dict[str, Any] = {
            "worker_id": self.worker_id,
            "model": self.model,
            "serving": self.serving,
            "draining": self.draining,
            "running": self.running(),
            "max_jobs": self.max_jobs,
            "loop_age_s": round(loop_age, 3),
            "redis_age_s": None if redis_age is None else round(redis_age, 3),
        }
        alive = loop_age <= STALL_S
        if path == "/health/live":
            return (200 if alive else 503), {"status": "ok" if alive else "stalled", **body}
        fresh = redis_age is not None and redis_age <= STALL_S
        ready = alive and self.serving and not self.draining and fresh
        return (200 if ready else 503), {"status": "ready" if ready else "not_ready", **body}
