"""The worker's outbox: step outputs are written to Redis while the next step runs.

The engine loop puts one ``StepOutput`` per step (the job writes and the step's stats) and
goes straight on to the next step; one writer task takes what has piled up, merges it and
writes it in one round trip: every job's events, results and acknowledgements through the
fenced script (worker/leases.py) and the steps' telemetry, in one pipeline. So:

- order: one writer, first in first out, so a job's events land in the order made;
- coalescing under backpressure: when steps pile up while a write is in flight, a job's
  consecutive token events become one (positions in order, each once — what a reader of the
  event stream, or a re-run's ``Resume``, expects), so a slow Redis gets fewer, larger writes;
- backpressure: the queue holds ``capacity`` steps; a slow Redis makes ``put`` wait, which
  stalls the engine instead of growing memory;
- batched telemetry: steps' stats go with the next job write, or at most ``telemetry_s``
  after the oldest one waiting (the planner reads every ~50 ms): a step with nothing for a
  client (a ``final_only`` job's tokens are held, worker/job_run.py) costs no round trip;
- must-happen writes (events, results, acks) are retried with backoff until Redis answers;
  telemetry is best effort (dropped with a warning when its write fails).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from redis.exceptions import NoScriptError, RedisError

from shared.control import Telemetry
from shared.loops import Signal, retry_redis
from shared.schemas import JobEvent, TokenEvent
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


_JOINED = {"job_id", "index", "token_ids", "text", "logprobs", "spec"}


def _joined(a: TokenEvent, b: TokenEvent) -> TokenEvent | None:
    """``a`` then ``b`` as one event, when ``b`` continues ``a`` (and carries nothing else)."""
    if b.index != a.index + len(a.token_ids) or (a.logprobs is None) != (b.logprobs is None):
        return None
    if (a.spec is None) != (b.spec is None):
        return None
    if b.model_dump(exclude=_JOINED, exclude_defaults=True):  # e.g. prompt_logprobs: its own event
        return None
    update: dict[str, object] = {"token_ids": a.token_ids + b.token_ids, "text": a.text + b.text}
    if a.logprobs is not None and b.logprobs is not None:
        update["logprobs"] = type(a.logprobs).join([a.logprobs, b.logprobs])
    if a.spec is not None and b.spec is not None:
        update["spec"] = a.spec.model_copy(
            update={"steps": a.spec.steps + b.spec.steps, "spans": a.spec.spans + b.spec.spans}
        )
    return a.model_copy(update=update)


def coalesce(events: list[JobEvent]) -> list[JobEvent]:
    """A job's events with each run of consecutive token events joined into one."""
    out: list[JobEvent] = []
    for ev in events:
        last = out[-1] if out else None
        if isinstance(ev, TokenEvent) and isinstance(last, TokenEvent):
            joined = _joined(last, ev)
            if joined is not None:
                out[-1] = joined
                continue
        out.append(ev)
    return out


def merge(items: list[StepOutput]) -> tuple[list[JobWrite], list[StepStats]]:
    """Several steps' outputs as one write per job (events in order, consecutive token events
    joined) and their stats."""
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
    if len(items) > 1:
        for w in by_job.values():
            w.events = coalesce(w.events)
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
        telemetry_s: float = 0.02,
    ) -> None:
        self.leases = leases
        self.telemetry = telemetry
        self.on_written = on_written
        self.version = version  # (decision version, fallback) for telemetry
        self.max_batch = max_batch
        self.telemetry_s = telemetry_s
        self._stats: list[StepStats] = []  # steps' stats not yet sent
        self._stats_since = 0.0  # when the oldest of them came
        send, recv = anyio.create_memory_object_stream[StepOutput](capacity)
        self._send: MemoryObjectSendStream[StepOutput] = send
        self._recv: MemoryObjectReceiveStream[StepOutput] = recv
        self._put = 0
        self._handed = 0  # puts whose writes went to Redis (or that had nothing to send)
        self._taken = 0  # puts the writer holds and has not handed to Redis yet
        self._done = 0
        self._flushed = Signal()
        self.retries = 0  # must-happen writes retried after a Redis error (for tests, logs)
        self._seqs: dict[tuple[str, int], int] = {}  # (job, lease) -> its last write's number

    async def put(self, item: StepOutput) -> None:
        """Queue one step's output (waits while ``capacity`` steps are unwritten).

        A step with stats alone, while earlier stats wait out ``telemetry_s`` and the writer
        has taken everything put before, joins them here without waking the writer (whose
        timer sends them all): at concurrency 1 on nj-target that wake-up, a loop turn or two
        of the writer a step, was half of the worker's work between steps (docs/benchmarks/history,
        "stats that join the waiting ones")."""
        self._put += 1
        if (
            not item.writes
            and item.stats is not None
            and self._stats
            and self._done == self._put - 1  # in order: nothing earlier still queued
            and time.monotonic() - self._stats_since < self.telemetry_s
        ):
            self._stats.append(item.stats)
            self._handed += 1
            self._done += 1
            return
        await self._send.send(item)

    @property
    def unsent(self) -> bool:
        """Whether some output put here has not gone to Redis yet (queued, or being merged)."""
        return self._handed < self._put

    async def let_send(self, max_turns: int) -> None:
        """Turns of the event loop while an output put here has not gone to Redis (at most
        ``max_turns``), and one more once it has: called before the engine blocks the loop
        with a step. A writer still reading the last write's reply needs 2-4 turns to send
        the next (redis-py checks the connection, then writes); with the single turn there
        was, such a write sat out the whole next step: at 32 users on nj-target a job's
        result landed a median 17-39 ms after its last token, 9-17 ms with the turns
        (docs/benchmarks/history, "The writer's turns"). With nothing queued it is one turn, as before."""
        await anyio.lowlevel.checkpoint()
        turns = 1
        while self.unsent and turns < max_turns:
            await anyio.lowlevel.checkpoint()
            turns += 1
        if turns > 1:  # handed over during these turns: one more for the send to finish
            await anyio.lowlevel.checkpoint()

    def _hand_over(self) -> None:
        self._handed += self._taken
        self._taken = 0

    async def flush(self) -> None:
        """Wait until everything put so far is written."""
        target = self._put
        while self._done < target:
            await self._flushed.wait()

    async def run(self) -> None:
        """The writer: forever take what piled up, write it, report it."""
        while True:
            items = await self._take()
            self._taken = len(items)
            writes, stats = merge(items)
            if stats and not self._stats:
                self._stats_since = time.monotonic()
            self._stats += stats
            due = bool(self._stats) and time.monotonic() - self._stats_since >= self.telemetry_s
            sent, self._stats = (self._stats, []) if writes or due else ([], self._stats)
            held = await self._write(writes, sent)
            self._hand_over()  # (a no-op when the write went: handed over as it went)
            self._done += len(items)
            self._flushed.fire()
            if writes:
                self.on_written([Written(w, h) for w, h in zip(writes, held, strict=True)])

    async def _take(self) -> list[StepOutput]:
        """What piled up: at least one step's output, or none once waiting stats are due."""
        items: list[StepOutput] = []
        if not self._stats:
            items.append(await self._recv.receive())
        else:
            with anyio.move_on_after(self._stats_since + self.telemetry_s - time.monotonic()):
                items.append(await self._recv.receive())
        while len(items) < self.max_batch:
            try:
                items.append(self._recv.receive_nowait())
            except anyio.WouldBlock:
                break
        return items

    async def _write(self, writes: list[JobWrite], stats: list[StepStats]) -> list[bool]:
        """The job writes and the telemetry in one round trip; per job, whether it was held.

        Job writes must happen: if the pipeline fails (or the script is not loaded), they are
        retried alone until Redis answers. Telemetry is best effort: dropped with a warning.
        """
        # Numbered once, before any retry: a retried batch whose first try landed (its reply
        # lost with the connection) is then skipped by the script instead of written twice.
        for w in writes:
            key = (w.job_id, w.lease)
            w.seq = self._seqs[key] = self._seqs.get(key, 0) + 1
            if w.final is not None:
                del self._seqs[key]
        sent = await self._telemetry(stats) if stats else []
        if not writes and not sent:
            return []
        try:
            async with self.leases.r.pipeline(transaction=False) as pipe:
                if writes:
                    self.leases.queue_write(pipe, writes)
                self.telemetry.queue(pipe, sent)
                self._hand_over()
                replies: list[object] = await pipe.execute(raise_on_error=False)
        except (RedisError, OSError) as exc:
            replies = [exc] * (bool(writes) + len(sent))
        failed = [x for x in replies[bool(writes) :] if isinstance(x, BaseException)]
        if failed:
            log.warning("telemetry of %d steps not published: %s", len(sent), failed[0])
        if not writes:
            return []
        if not isinstance(replies[0], BaseException):
            return self.leases.held(replies[0])
        if not isinstance(replies[0], NoScriptError):  # (not loaded yet, or Redis restarted)
            self.retries += 1
        return await self._write_jobs(writes)

    async def _telemetry(self, stats: list[StepStats]) -> list[Telemetry]:
        version, fallback = self.version()
        try:
            return await self.telemetry.prepare(stats, version, fallback)
        except (RedisError, OSError) as exc:
            log.warning("telemetry of %d steps not published: %s", len(stats), exc)
            return []

    async def _write_jobs(self, writes: list[JobWrite]) -> list[bool]:
        """The job writes alone, until Redis answers (the script loaded again if need be)."""

        def count(_: BaseException) -> None:
            self.retries += 1

        return await retry_redis(
            "job writes", lambda: self.leases.write(writes), backoff_s=0.05, on_error=count
        )
