"""What the capacity estimate reads from Redis: each model's queue, workers and profile.

One ``refresh`` per ``capacity_s``: the registry (``keys.WORKERS``) names the live workers
and their models (telemetry is attributed through it), and for every model the planner
knows — live, configured (``--plan-models``: a model scaled to zero has no live worker), or
seen before — its job stream's and finished stream's ``entries-added`` (XINFO STREAM), its
group's pending and lag, and its cost profile (``keys.cost_profile``; the last good one is
kept).
"""

from __future__ import annotations

import logging
from typing import Any

import redis.asyncio as aioredis
from pydantic import ValidationError
from redis.exceptions import ResponseError

from planner.capacity import CapacityPlanner, QueueSample
from shared import codec, keys
from shared.control import WorkerInfo
from shared.profile import CostProfile
from shared.streams import group_load

log = logging.getLogger(__name__)


async def _added(r: aioredis.Redis, stream: str) -> int:
    try:
        info: dict[Any, Any] = await r.xinfo_stream(stream)
    except ResponseError:  # no such stream yet
        return 0
    return int(info.get("entries-added") or info.get(b"entries-added") or 0)


async def read_queue(r: aioredis.Redis, model: str) -> QueueSample:
    pending, lag = await group_load(r, keys.jobs_stream(model), keys.JOBS_GROUP)
    added = await _added(r, keys.jobs_stream(model))
    finished = await _added(r, keys.finished_stream(model))
    return QueueSample(added, finished, pending, lag)


async def live_workers(r: aioredis.Redis) -> list[WorkerInfo]:
    out = []
    for raw in (await r.hgetall(keys.WORKERS)).values():
        try:
            info = codec.decode_as(raw if isinstance(raw, bytes) else raw.encode(), WorkerInfo)
        except codec.CodecError:
            continue
        if info.is_alive():
            out.append(info)
    return out


class CapacityReader:
    """Reads what ``CapacityPlanner`` needs and feeds it; keeps each model's last profile."""

    def __init__(self, r: aioredis.Redis, planner: CapacityPlanner, models: list[str] | None = None) -> None:
        self.r = r
        self.planner = planner
        self.configured = list(models or [])
        self.profiles: dict[str, CostProfile] = {}

    async def profile(self, model: str) -> CostProfile | None:
        raw = await self.r.get(keys.cost_profile(model))
        if raw is not None:
            try:
                self.profiles[model] = CostProfile.loads(raw)
            except (ValidationError, ValueError) as exc:
                log.error("ignoring the unreadable cost profile of %s: %s", model, exc)
        return self.profiles.get(model)

    async def refresh(self, now: float | None = None) -> dict[str, int]:
        """One look at every model; returns model -> desired workers."""
        workers = await live_workers(self.r)
        self.planner.know_workers(workers)
        models = sorted({w.model for w in workers} | set(self.configured) | set(self.planner.models))
        for model in models:
            q = await read_queue(self.r, model)
            mine = [w for w in workers if w.model == model]
            self.planner.model(model).sample(q, mine, await self.profile(model), now)
        return self.planner.desired()
