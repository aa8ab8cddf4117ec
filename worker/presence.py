"""Worker registration: one field per worker in ``keys.WORKERS``, refreshed as a heartbeat."""

from __future__ import annotations

import os
import socket
import time

import redis.asyncio as aioredis

from shared import codec, keys
from shared.control import WorkerInfo


class Presence:
    def __init__(
        self,
        r: aioredis.Redis,
        worker_id: str,
        model: str,
        max_jobs: int,
        max_model_len: int = 0,
        drafters: list[str] | None = None,
    ) -> None:
        self.r = r
        self.drafters = list(drafters or [])
        self.worker_id = worker_id
        self.model = model
        self.max_jobs = max_jobs
        self.max_model_len = max_model_len
        self.started_at = time.time()

    async def beat(self, running: int, decision_version: int, fallback: bool, draining: bool = False) -> None:
        info = WorkerInfo(
            worker_id=self.worker_id,
            model=self.model,
            host=socket.gethostname(),
            pid=os.getpid(),
            started_at=self.started_at,
            running=running,
            max_jobs=self.max_jobs,
            decision_version=decision_version,
            fallback=fallback,
            max_model_len=self.max_model_len,
            draining=draining,
            drafters=self.drafters,
        )
        await self.r.hset(keys.WORKERS, self.worker_id, codec.encode(info))

    async def leave(self) -> None:
        await self.r.hdel(keys.WORKERS, self.worker_id)
