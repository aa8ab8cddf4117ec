"""One blocking read per model for every job event stream this gateway follows.

A gateway follows one event stream per request in flight. Read one blocking ``XREAD`` each,
that is a connection each, and — on the embedded store — a wake-up of every one of those
readers at every write anywhere (fakeredis wakes all blocked clients on each key change), so
a step of 32 jobs cost ~1,000 wake-ups. The hub instead runs one task per model whose one
``XREAD`` covers every followed stream of that model (their keys share the model's hash tag,
so the read stays in one Redis Cluster slot) plus a small wake stream of its own, written
when a new stream is followed so that the blocked read starts over including it.

A reader that wants only a job's final event (a non-streaming request) follows the model's
finished stream instead (``keys.finished_stream``: the worker adds the job id with the final
event): its job's token events then wake nothing, and a burst of such requests needs no
wake either once the read covers that stream. When its job's id comes by, the hub fetches
the job's last event (the final one) for it, or with ``history`` all of its events (the
final one last) in that same round trip. The hub looks at the job's status once, when it
follows it (``Subscription.over``), for a job that ended before its read covered it.

``Subscription.read(after, block_ms)`` answers like an ``XREAD`` of one stream: the entries
after ``after``, waiting up to ``block_ms`` (None: no wait) for the first (for a final-only
reader, only the final entry ever comes).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import deque
from typing import Any

import anyio
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.outage import BACKOFF
from shared import jobs, keys
from shared.streams import Entry, entries, id_str

log = logging.getLogger(__name__)

BLOCK_MS = 5_000  # the hub's read returns at least this often (a no-op round when idle)
WAKE_MAXLEN = 64
WAKE_TTL_S = 3600


_MAX_PART = 2**64 - 1  # a stream id is two unsigned 64-bit numbers


def _clamped(cursor: str) -> str:
    """``cursor`` as Redis accepts it: a (well-formed) id past the largest possible one is that
    one — nothing comes after either. Else one client's hostile Last-Event-ID would fail the
    shared read of every stream."""
    a, _, b = cursor.partition("-")
    if int(a) > _MAX_PART or int(b or 0) > _MAX_PART:
        return f"{_MAX_PART}-{_MAX_PART}"
    return cursor


def _after(entry_id: str, cursor: str) -> bool:
    """Whether stream id ``entry_id`` comes after ``cursor`` (both ``ms-seq``)."""
    a, _, b = entry_id.partition("-")
    c, _, d = cursor.partition("-")
    return (int(a), int(b or 0)) > (int(c), int(d or 0))


class Subscription:
    """The entries of one stream that the hub delivered, for one reader."""

    def __init__(
        self, hub: EventHub, model: str, stream: str, final_of: str | None = None, *, history: bool = False
    ) -> None:
        self.hub, self.model, self.stream = hub, model, stream
        self.final_of = final_of  # a job id: only that job's final event is wanted
        self.history = history  # (with final_of) every event of the job, once it ended
        self.over = False  # (with final_of) the job was over (or gone) when the hub followed it
        self.fetching = self.fetched = False  # (with final_of) the hub fetches / found its final
        self.cursor = "0-0"  # the newest id the hub has read for this reader
        self._buffer: deque[Entry] = deque()
        self._arrived = anyio.Event()
        self._started = False
        self._error: BaseException | None = None

    def fail(self, exc: BaseException) -> None:
        """The hub's read failed: the reader gets the error at its next read, as it would
        from its own XREAD (the stream's client then hears of the outage)."""
        self._error = exc
        self._arrived.set()

    def deliver(self, got: list[Entry]) -> None:
        for entry_id, fields in got:
            eid = id_str(entry_id)
            if _after(eid, self.cursor):
                self._buffer.append((entry_id, fields))
                self.cursor = eid
        if self._buffer:
            self._arrived.set()

    async def start(self, after: str) -> None:
        """Have the hub follow the stream from just after ``after`` (once; the first ``read``
        does it too). A final-only reader knows ``over`` from then on."""
        if not self._started:
            self._started = True
            self.cursor = _clamped(after)
            await self.hub.follow(self)

    async def read(self, after: str, block_ms: int | None) -> list[Entry]:
        """Entries after ``after``; waits up to ``block_ms`` for one (None: does not wait)."""
        after = _clamped(after)
        while self._buffer and not _after(id_str(self._buffer[0][0]), after):
            self._buffer.popleft()
        await self.start(after)
        if not self._buffer and block_ms is not None:
            with anyio.move_on_after(block_ms / 1000):
                await self._arrived.wait()
        if self._error is not None and not self._buffer:
            exc, self._error = self._error, None
            self._arrived = anyio.Event()
            raise exc
        if not self._buffer and block_ms is None:  # a last look, straight from the stream
            resp = await self.hub.r.xread({self.stream: after}, count=256)
            return entries(resp)
        got = list(self._buffer)
        self._buffer.clear()
        self._arrived = anyio.Event()
        return got

    def close(self) -> None:
        self.hub.unfollow(self)


class EventHub:
    def __init__(self, r: aioredis.Redis) -> None:
        self.r = r
        self.id = uuid.uuid4().hex[:12]
        self._subs: dict[str, set[Subscription]] = {}  # model -> subscriptions
        self._running: set[str] = set()  # models whose reader task runs
        self._woken: set[str] = set()  # models whose reader was woken and has not started over yet
        self._tasks: set[asyncio.Task[None]] = set()
        self._finished: dict[str, str] = {}  # model -> cursor on its finished stream
        self._covering: set[str] = set()  # models whose read in flight covers that stream

    def subscribe(
        self, model: str, stream: str, final_of: str | None = None, *, history: bool = False
    ) -> Subscription:
        """A reader of ``stream``; with ``final_of`` (its job's id), of the final event only,
        or with ``history`` of every event of the job at once when it ends."""
        return Subscription(self, model, stream, final_of, history=history)

    async def follow(self, sub: Subscription) -> None:
        final_only = sub.final_of is not None
        if final_only and sub.model not in self._finished:
            # From here on: a job that ends after the check below is read past this cursor.
            self._finished[sub.model] = await self._newest_finished(sub.model)
        self._subs.setdefault(sub.model, set()).add(sub)
        if sub.model not in self._running:
            self._running.add(sub.model)
            self._spawn(sub.model)
        elif final_only and sub.model in self._covering:
            pass  # the blocked read already covers the finished stream: nothing to wake
        elif sub.model not in self._woken:  # the blocked read must start over with this stream
            # One wake until the reader starts over: the followers that come meanwhile (a
            # burst of requests) are in its next read too.
            self._woken.add(sub.model)
            wake = keys.gateway_wake(sub.model, self.id)
            try:
                async with self.r.pipeline(transaction=False) as pipe:
                    pipe.xadd(wake, {b"w": b"1"}, maxlen=WAKE_MAXLEN, approximate=True)
                    pipe.expire(wake, WAKE_TTL_S)
                    await pipe.execute()
            except BaseException:
                self._woken.discard(sub.model)  # not woken: the next follower tries again
                raise
        if final_only:
            await self._final_if_ended(sub)  # it may have ended before the read covered it

    async def _newest_finished(self, model: str) -> str:
        got = await self.r.xrevrange(keys.finished_stream(model), count=1)
        return id_str(got[0][0]) if got else "0-0"

    async def _final_if_ended(self, sub: Subscription) -> None:
        assert sub.final_of is not None
        if jobs.is_over(await self.r.hget(keys.job_key(sub.model, sub.final_of), jobs.STATUS)):
            sub.over = True
            if not (sub.fetched or sub.fetching):  # (else the finished stream's read came first)
                await self._deliver_finals([sub])  # (gone: its stream is empty, nothing comes)

    async def _deliver_finals(self, subs: list[Subscription]) -> None:
        """Each reader's job's last event (its final one), or all of them for a reader with
        ``history``, in one round trip."""
        for s in subs:
            s.fetching = True
        try:
            async with self.r.pipeline(transaction=False) as pipe:
                for s in subs:
                    if s.history:
                        pipe.xrange(s.stream)
                    else:
                        pipe.xrevrange(s.stream, count=1)
                replies = await pipe.execute()
        except (RedisError, OSError) as exc:
            for s in subs:
                s.fail(exc)
            return
        finally:
            for s in subs:
                s.fetching = False
        for s, got in zip(subs, replies, strict=True):
            s.fetched = bool(got)
            s.deliver(list(got))

    def unfollow(self, sub: Subscription) -> None:
        subs = self._subs.get(sub.model)
        if subs is not None:
            subs.discard(sub)

    def _spawn(self, model: str) -> None:
        self._tasks.add(task := asyncio.get_running_loop().create_task(self._read_loop(model)))
        task.add_done_callback(self._tasks.discard)

    async def _read_loop(self, model: str) -> None:
        """Read every followed stream of ``model`` at once until none is followed."""
        try:
            await self._read(model)
        finally:
            self._running.discard(model)

    async def _read(self, model: str) -> None:
        wake = keys.gateway_wake(model, self.id)
        wake_cursor = "0-0"  # the wake stream is this hub's own: every entry is news
        failures = 0
        while True:
            if not self._subs.get(model):
                return  # (no await since the check: a new follower finds no loop and starts one)
            subs = list(self._subs[model])
            self._woken.discard(model)  # this read includes every follower so far
            cursors: dict[Any, Any] = {}
            for s in subs:
                if s.final_of is not None:
                    continue
                cur = cursors.get(s.stream)
                cursors[s.stream] = s.cursor if cur is None or _after(cur, s.cursor) else cur
            finished = keys.finished_stream(model)
            if len(cursors) < len(subs):  # final-only readers: the finished stream instead
                cursors[finished] = self._finished[model]
                self._covering.add(model)
            try:
                resp = await self.r.xread({**cursors, wake: wake_cursor}, count=256, block=BLOCK_MS)
                failures = 0
            except (RedisError, OSError) as exc:
                if not failures:
                    log.warning("event hub for %s: %s: %s (retrying)", model, type(exc).__name__, exc)
                for s in subs:  # each reader rides the outage out on its own (gateway/outage.py)
                    s.fail(exc)
                failures += 1
                await anyio.sleep(BACKOFF.compute(failures))
                continue
            finally:
                self._covering.discard(model)
            by_stream = _by_stream(resp)
            for stream, got in by_stream.items():
                if stream == wake:
                    wake_cursor = id_str(got[-1][0])
                elif stream == finished:
                    self._finished[model] = id_str(got[-1][0])
                    await self._ended(model, got)
                else:
                    for s in subs:
                        if s.stream == stream:
                            s.deliver(got)

    async def _ended(self, model: str, got: list[Entry]) -> None:
        """Jobs that ended: the final event of each followed by a final-only reader (every
        such reader now, not only those of this read: one may have come meanwhile)."""
        done = {id_str(fields.get(b"j", b"")) for _, fields in got}
        # (Not those whose final the hub fetches or fetched already: once is enough.)
        subs = self._subs.get(model, ())
        waiting = [s for s in subs if s.final_of in done and not (s.fetched or s.fetching)]
        if waiting:
            await self._deliver_finals(waiting)


def _by_stream(resp: Any) -> dict[str, list[Entry]]:
    """An XREAD reply as stream name -> entries (RESP3 maps, RESP2 pairs)."""
    out: dict[str, list[Entry]] = {}
    if not resp:
        return out
    pairs = resp.items() if isinstance(resp, dict) else resp
    for stream, got in pairs:
        name = stream.decode() if isinstance(stream, bytes) else str(stream)
        out[name] = [(eid, f) for eid, f in got if f is not None]
    return out
