"""The gateway's read of who serves: the workers' heartbeats and the planner's latest decision.

Admission asks for the serving workers on every submit, so a non-empty answer is cached for
``WORKERS_CACHE_S``; health, /v1/models and the queue-load gauges read the registry as is.
"""

from __future__ import annotations

import time

import redis.asyncio as aioredis

from shared import codec, keys
from shared.control import Decision, WorkerInfo

WORKERS_CACHE_S = 1.0  # how long a read of the worker registry answers admission checks


def raw_bytes(v: bytes | str) -> bytes:
    """A Redis reply as bytes (a client with decode_responses gives str)."""
    return v if isinstance(v, bytes) else v.encode()


class WorkerRegistry:
    def __init__(self, r: aioredis.Redis, worker_timeout_s: float) -> None:
        self.r = r
        self.worker_timeout_s = worker_timeout_s  # a heartbeat older than this is a dead worker
        self._serving: tuple[float, list[WorkerInfo]] = (0.0, [])

    async def workers(self, timeout_s: float | None = None) -> list[WorkerInfo]:
        """Workers that sent a heartbeat within ``timeout_s`` (default: the worker timeout)."""
        timeout_s = self.worker_timeout_s if timeout_s is None else timeout_s
        now = time.time()
        alive = []
        for raw in (await self.r.hgetall(keys.WORKERS)).values():
            try:
                info = codec.decode_as(raw_bytes(raw), WorkerInfo)
            except codec.CodecError:
                continue
            if info.is_alive(now, timeout_s):
                alive.append(info)
        return alive

    async def serving(self) -> list[WorkerInfo]:
        """Live workers that take new jobs (not draining); a non-empty answer is cached for
        WORKERS_CACHE_S (an empty one is not: the first worker to register is seen at once)."""
        at, cached = self._serving
        now = time.monotonic()
        if now - at > WORKERS_CACHE_S or not cached:
            cached = [w for w in await self.workers() if not w.draining]
            self._serving = (now, cached)
        return cached

    async def latest_decision(self) -> Decision | None:
        raw = await self.r.get(keys.DECISION_LATEST)
        if raw is None:
            return None
        try:
            return codec.decode_as(raw_bytes(raw), Decision)
        except codec.CodecError:
            return None
