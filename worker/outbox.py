"""The worker's outbox: step outputs are written to Redis while the next step runs.

The engine loop puts one ``StepOutput`` per step (the job writes and the step's stats) and
goes straight on to the next step; one writer task takes what has piled up, merges it and
writes it in one round trip: every job's events, results and acknowledgements through the
fenced script (worker/leases.py), then the telemetry. So:

- order: one writer, first in first out, so a job's events land in the order made;
- backpressure: the queue holds ``capacity`` steps; a slow Redis makes ``put`` wait, which
  stalls the engine instead of growing memory;
- must-happen writes (events, results, acks) are retried with backoff until Redis answers;
  telemetry is best effort (dropped with a warning when its write fails).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from redis.exceptions import RedisError

from shared.loops import Signal, retry_redis
from worker.engine.api import StepStats
from worker.leases import JobWrite, Leases
from worker.telemetry import TelemetryPublisher

log = logging.getLogger(__name__)


@dataclass
class StepOutput:
    writes: list[JobWrite] = field(default_factory=list)
    stats: StepStats | None = None  # None: nothing to report (e.g. a flush marker)


@dataclass
class Written:
    """One job's write, and whether the job was still this worker's when it landed."""

    write: JobWrite
    held: bool


def merge(items: list[StepOutput]) -> tuple[list[JobWrite], list[StepStats]]:
    """Several steps' outputs as one write per job (events in order) and their stats."""
    by_job: dict[str, JobWrite] = {}
    stats: list[StepStats] = []
    for item in items:
        for w in item.writes:
            got = by_job.get(w.job_id)
            if got is None or got.lease != w.lease:
                by_job[w.job_id] = JobWrite(w.job_id, w.lease, w.entry_id, list(w.events), w.final)
            else:
                got.events += w.events
                got.final = got.final or w.final
        if item.stats is not None:
            stats.append(item.stats)
    return list(by_job.values()), stats


class Outbox:
    def __init__(
        self,
        leases: Leases,
        telemetry: TelemetryPublisher,
        on_written: Callable[[list[Written]], None],
        version: Callable[[], tuple[int, bool]],
        capacity: int = 4,
        max_batch: int = 64,
    ) -> None:
        self.leases = leases
        self.telemetry = telemetry
        self.on_written = on_written
        self.version = version  # (decision version, fallback) for telemetry
        self.max_batch = max_batch
        send, recv = anyio.create_memory_object_stream[StepOutput](capacity)
        self._send: MemoryObjectSendStream[StepOutput] = send
        self._recv: MemoryObjectReceiveStream[StepOutput] = recv
        self._put = 0
        self._done = 0
        self._flushed = Signal()
        self.retries = 0  # must-happen writes retried after a Redis error (for tests, logs)
        self._seqs: dict[tuple[str, int], int] = {}  # (job, lease) -> its last write's number

    async def put(self, item: StepOutput) -> None:
        """Queue one step's output (waits while ``capacity`` steps are unwritten)."""
        self._put += 1
        await self._send.send(item)

    async def flush(self) -> None:
        """Wait until everything put so far is written."""
        target = self._put
        while self._done < target:
            await self._flushed.wait()

    async def run(self) -> None:
        """The writer: forever take what piled up, write it, report it."""
        while True:
            items = [await self._recv.receive()]
            while len(items) < self.max_batch:
                try:
                    items.append(self._recv.receive_nowait())
                except anyio.WouldBlock:
                    break
            writes, stats = merge(items)
            held = await self._write_jobs(writes)
            if stats:
                await self._write_telemetry(stats)
            self._done += len(items)
            self._flushed.fire()
            if writes:
                self.on_written([Written(w, h) for w, h in zip(writes, held, strict=True)])

    async def _write_jobs(self, writes: list[JobWrite]) -> list[bool]:
        # Numbered once, before any retry: a retried batch whose first try landed (its reply
        # lost with the connection) is then skipped by the script instead of written twice.
        for w in writes:
            key = (w.job_id, w.lease)
            w.seq = self._seqs[key] = self._seqs.get(key, 0) + 1
            if w.final is not None:
                del self._seqs[key]

        def count(_: BaseException) -> None:
            self.retries += 1

        return await retry_redis(
            "job writes", lambda: self.leases.write(writes), backoff_s=0.05, on_error=count
        )

    async def _write_telemetry(self, stats: list[StepStats]) -> None:
        version, fallback = self.version()
        try:
            await self.telemetry.publish_many(stats, version, fallback)
        except (RedisError, OSError) as exc:
            log.warning("telemetry of %d steps not published: %s", len(stats), exc)
