"""Riding out a Redis outage while a client waits for its job.

A Redis outage is not the job's failure: the worker keeps running it (its writes wait in its
outbox, worker/outbox.py) and they land once Redis is back. So a reader of a job's events
(an OpenAI request, streamed or not; ``GET /v1/jobs/{id}/events``) keeps its client's
connection, retries with backoff (redis-py's ``EqualJitterBackoff``: spread, so a thousand
readers do not reconnect in one instant) and resumes the job's event stream from the last
entry it delivered — entry ids are the stream's own, so nothing is repeated or skipped —
for up to ``outage_grace_s`` (``--outage-grace`` / ``NIGHTJAR_OUTAGE_GRACE_S``, 30 s).
Past it the error goes up: an OpenAI request is answered 503 with ``Retry-After`` (once
streaming: an error chunk and ``[DONE]``) and its job is cancelled; the cancel is written
at once if Redis answers, else remembered (``CancelBacklog``) and written as soon as it
does, so no worker goes on working for a client that was given an error.

A new submission during an outage is still a fast 503 with ``Retry-After`` (nothing was
accepted, nothing waits): only what the gateway already accepted rides the outage out.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

import anyio
from redis.backoff import EqualJitterBackoff
from redis.exceptions import RedisError

log = logging.getLogger("nightjar.gateway")

T = TypeVar("T")
BACKOFF = EqualJitterBackoff(cap=1.0, base=0.05)  # 25 ms .. 1 s between tries
MAX_REMEMBERED_CANCELS = 100_000  # then the oldest is dropped (logged)
LOG_EVERY_S = 5.0


class Event(Protocol):
    """What a resumed reader yields: an entry of the job's event stream (``id`` is its
    stream entry id)."""

    @property
    def id(self) -> str: ...


E = TypeVar("E", bound=Event)


@dataclass
class OutageStats:
    """A gateway's readers and outages (its /metrics shows ``waiting``; tests wait on them)."""

    waiting: int = 0  # readers riding out an outage now
    resumed: int = 0  # outages ridden out
    gave_up: int = 0  # outages that lasted past the grace period
    abandoned: int = 0  # readers that went away during one (client gone, deadline)


class OutageLog:
    """The log of Redis outages as this process's readers meet them: one line when the first
    reader finds Redis gone, one when the last of them is through (resumed, given up or
    gone), one the first time a reader gives up in it — not one per reader per try (a
    thousand readers in one outage would log thousands of lines)."""

    def __init__(self) -> None:
        self.down = 0  # readers in an outage now
        self.since: float | None = None  # anyio time the first of them found Redis gone
        self.resumed = self.gave_up = 0  # of the readers of the current outage

    def start(self, what: str, exc: BaseException) -> None:
        self.down += 1
        if self.down == 1:
            self.since, self.resumed, self.gave_up = anyio.current_time(), 0, 0
            log.warning("Redis unreachable (%s: %s; first noticed by %s); readers resume when it answers",
                        type(exc).__name__, exc, what)  # fmt: skip

    def give_up(self, what: str, waited_s: float, grace_s: float) -> None:
        self.gave_up += 1
        if self.gave_up == 1:
            log.warning("Redis unreachable for %.1f s, past the %g s grace period: readers give up "
                        "(first: %s)", waited_s, grace_s, what)  # fmt: skip
        self._end()

    def resume(self) -> None:
        self.resumed += 1
        self._end()

    def leave(self) -> None:
        self._end()

    def _end(self) -> None:
        self.down = max(0, self.down - 1)
        if self.down == 0 and self.since is not None:
            took = anyio.current_time() - self.since
            log.info("Redis outage over for this gateway's readers after %.1f s: %d resumed, %d gave up",
                     took, self.resumed, self.gave_up)  # fmt: skip
            self.since = None


OUTAGE_LOG = OutageLog()  # this process's


class Outage:
    """One reader's ride through an outage: how long to wait before the next try, and when
    the outage has lasted past the grace period. Use it in ``with``: a reader that goes
    away during an outage is then no longer counted as waiting."""

    def __init__(self, grace_s: float, what: str, stats: OutageStats | None = None) -> None:
        self.grace_s = grace_s
        self.what = what
        self.stats = stats if stats is not None else OutageStats()
        self.since: float | None = None  # anyio time of the first failure of this outage
        self.failures = 0

    def __enter__(self) -> Outage:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.since is not None:
            self.since = None
            self.stats.waiting -= 1
            self.stats.abandoned += 1
            OUTAGE_LOG.leave()

    @property
    def down(self) -> bool:
        return self.since is not None

    def failed(self, exc: BaseException) -> float:
        """A Redis call failed: seconds to wait before the next try. Raises ``exc`` once
        the outage has lasted ``grace_s``."""
        now = anyio.current_time()
        if self.since is None:
            self.since = now
            self.stats.waiting += 1
            OUTAGE_LOG.start(self.what, exc)
        left = self.since + self.grace_s - now
        if left <= 0:
            OUTAGE_LOG.give_up(self.what, now - self.since, self.grace_s)
            self.since = None
            self.stats.waiting -= 1
            self.stats.gave_up += 1
            raise exc
        self.failures += 1
        return min(BACKOFF.compute(self.failures), left)

    @staticmethod
    def keepalive_due(quiet_since: float, block_s: float, until: float | None) -> bool:
        """Whether a reader quiet since ``quiet_since`` owes its caller a None (a keep-alive
        every ``block_s``, and the deadline ``until``)."""
        now = anyio.current_time()
        return now - quiet_since >= block_s or (until is not None and now >= until)

    def recovered(self) -> None:
        """Redis answered again (a no-op when it never stopped)."""
        if self.since is not None:
            log.debug("%s: resumed after %.1f s without Redis", self.what, anyio.current_time() - self.since)
            OUTAGE_LOG.resume()
            self.stats.waiting -= 1
            self.stats.resumed += 1
        self.since, self.failures = None, 0

    async def ride(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """``attempt()``, tried again through an outage of up to the grace period."""
        while True:
            try:
                got = await attempt()
            except (RedisError, OSError) as exc:
                await anyio.sleep(self.failed(exc))
                continue
            self.recovered()
            return got


async def resumed(
    read: Callable[[str], AsyncIterator[E | None]],
    after: str,
    *,
    grace_s: float,
    block_s: float,
    until: float | None,
    what: str,
    stats: OutageStats | None = None,
) -> AsyncIterator[E | None]:
    """``read(after)``'s items, read again from just after the last entry delivered whenever
    Redis fails, for as long as an outage lasts under ``grace_s`` (then the error is raised).
    Meanwhile it yields None every ``block_s`` and once ``until`` has passed, as ``read``
    does while nothing comes: the caller keeps its client's connection alive and its
    deadline in force. Any item ``read`` yields (None too: it yields one only once Redis
    answered) ends the outage."""
    with Outage(grace_s, what, stats) as outage:
        quiet_since = anyio.current_time()
        while True:
            try:
                async for item in read(after):
                    outage.recovered()
                    if item is not None:
                        after = item.id
                    quiet_since = anyio.current_time()
                    yield item
                return
            except (RedisError, OSError) as exc:
                wait = outage.failed(exc)
            if outage.keepalive_due(quiet_since, block_s, until):
                quiet_since = anyio.current_time()
                yield None
            await anyio.sleep(wait)


class CancelBacklog:
    """Cancels the gateway could not write because Redis was down, written once it answers
    (in order, each once it went through; a task runs while any is pending). Kept in this
    process only: a gateway that dies meanwhile forgets them (the jobs then run to the end,
    as before this existed)."""

    def __init__(self, write: Callable[[str], Awaitable[None]]) -> None:
        self._write = write
        self._pending: OrderedDict[str, None] = OrderedDict()
        self._task: asyncio.Task[None] | None = None
        self.written = 0  # cancels written after an outage, all told

    def __len__(self) -> int:
        return len(self._pending)

    def __contains__(self, job_id: str) -> bool:
        return job_id in self._pending

    def add(self, job_id: str) -> None:
        """Remember ``job_id``'s cancel; it is written as soon as Redis answers."""
        self._pending[job_id] = None
        if len(self._pending) > MAX_REMEMBERED_CANCELS:
            dropped, _ = self._pending.popitem(last=False)
            log.error("over %d cancels wait for Redis: job %s's is dropped", MAX_REMEMBERED_CANCELS, dropped)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        failures, logged, written = 0, -math.inf, 0
        while self._pending:
            job_id = next(iter(self._pending))
            try:
                await self._write(job_id)
            except (RedisError, OSError) as exc:
                failures += 1
                if time.monotonic() - logged >= LOG_EVERY_S:
                    n, kind = len(self._pending), type(exc).__name__
                    log.warning("%d cancels wait for Redis (%s: %s)", n, kind, exc)
                    logged = time.monotonic()
                await anyio.sleep(BACKOFF.compute(failures))
                continue
            except Exception:  # a bug must not keep the others from being written
                log.exception("cancel of job %s could not be written; dropped", job_id)
            else:
                written += 1
                self.written += 1
            self._pending.pop(job_id, None)
            failures = 0
        if written:
            log.info("wrote %d cancels that waited for Redis", written)
