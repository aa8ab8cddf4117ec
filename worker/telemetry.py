"""Telemetry for the planner: one message per engine step, plus an idle heartbeat."""

from __future__ import annotations

import time

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline

from shared import codec, keys
from shared.control import StepStats, Telemetry
from shared.streams import group_load


class TelemetryPublisher:
    """XADDs Telemetry (MAXLEN ~) and knows the job stream's lag for the queue depth."""

    def __init__(self, r: aioredis.Redis, worker_id: str, lag_refresh_s: float, *, model: str) -> None:
        self.r = r
        self.worker_id = worker_id
        self.jobs_stream = keys.jobs_stream(model)
        self.lag_refresh_s = lag_refresh_s
        self._lag = 0
        self._lag_at = float("-inf")

    async def job_lag(self) -> int:
        """Jobs not yet delivered to any worker (refreshed at most every ``lag_refresh_s``)."""
        now = time.monotonic()
        if now - self._lag_at >= self.lag_refresh_s:
            _, self._lag = await group_load(self.r, self.jobs_stream, keys.JOBS_GROUP)
            self._lag_at = now
        return self._lag

    def build(self, stats: StepStats, lag: int, decision_version: int, fallback: bool) -> Telemetry:
        """Telemetry is a StepStats plus its sender: every stat is carried, by construction;
        the service's own view of the decision in force wins over the engine's."""
        fields = dict(stats) | {"decision_version": decision_version, "fallback": fallback}
        return Telemetry(**fields, worker_id=self.worker_id, queue_depth=stats.waiting + lag)

    async def publish(self, stats: StepStats, decision_version: int, fallback: bool) -> Telemetry:
        """Publish one step's stats; an idle heartbeat is a step with batch_size 0."""
        (t,) = await self.publish_many([stats], decision_version, fallback)
        return t

    async def publish_many(
        self, stats: list[StepStats], decision_version: int, fallback: bool
    ) -> list[Telemetry]:
        """Publish several steps' stats in one round trip."""
        sent = await self.prepare(stats, decision_version, fallback)
        async with self.r.pipeline(transaction=False) as pipe:
            self.queue(pipe, sent)
            await pipe.execute()
        return sent

    async def prepare(self, stats: list[StepStats], decision_version: int, fallback: bool) -> list[Telemetry]:
        """The messages for several steps' stats (the outbox queues them with its job writes)."""
        lag = await self.job_lag()
        return [self.build(s, lag, decision_version, fallback) for s in stats]

    def queue(self, pipe: Pipeline, sent: list[Telemetry]) -> None:
        for t in sent:
            pipe.xadd(keys.TELEMETRY_STREAM, codec.entry(t), maxlen=keys.TELEMETRY_MAXLEN, approximate=True)
