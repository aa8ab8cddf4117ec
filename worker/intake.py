"""The worker's side of its model's job stream: one consumer of the workers' group.

At-least-once: an entry stays pending until XACK (then it is deleted: the stream holds only
jobs not yet answered). Entries left idle by a dead consumer are taken over with XAUTOCLAIM
before any new work; a restarted worker re-reads its own pending entries; a worker renews its
claim on the jobs it still holds (worker/leases.py) so they never look idle.
"""

from __future__ import annotations

import time
from typing import Any

import msgpack
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from shared import codec, keys
from shared.batch_band import BatchBand
from shared.streams import Entry, ensure_group, entries, id_str


class JobIntake:
    def __init__(
        self, r: aioredis.Redis, consumer: str, claim_idle_s: float, *, model: str, autoclaim_s: float = 0.0
    ) -> None:
        self.r = r
        self.consumer = consumer
        self.model = model
        self.stream = keys.jobs_stream(model)  # only this model's workers read it
        self.dead_letters = keys.dead_letter_stream(model)
        self.claim_idle_ms = int(claim_idle_s * 1000)
        self._own_cursor: str | None = "0"  # None once this consumer's old entries are all read
        self._claim_cursor = "0-0"
        self.autoclaim_s = autoclaim_s  # the sweep's period (0: every call sweeps)
        self._claim_due = float("-inf")  # monotonic time of the next sweep
        self._batch = BatchBand(r, model)

    async def setup(self) -> None:
        await ensure_group(self.r, self.stream, keys.JOBS_GROUP)

    async def read_own_pending(self, count: int) -> list[Entry]:
        """The next of the entries this consumer held before it (re)started; empty for good
        once all were read."""
        if self._own_cursor is None:
            return []
        resp = await self.r.xreadgroup(
            keys.JOBS_GROUP, self.consumer, {self.stream: self._own_cursor}, count=count
        )
        got = entries(resp)
        self._own_cursor = id_str(got[-1][0]) if got else None
        return got

    async def read_new(self, count: int, block_ms: int | None) -> list[Entry]:
        try:
            resp = await self.r.xreadgroup(
                keys.JOBS_GROUP, self.consumer, {self.stream: ">"}, count=count, block=block_ms
            )
        except ResponseError as exc:  # a Redis that restarted empty lost the group
            if "NOGROUP" not in str(exc):
                raise
            await self.setup()
            return []
        return entries(resp)

    async def read_live_then_batch(self, count: int, block_ms: int | None) -> list[Entry]:
        """New entries: live ones first; with none waiting, up to ``count`` batch jobs moved
        onto the stream (shared/batch_band.py); with none of either, a read blocking up to
        ``block_ms`` (None: no such read)."""
        got = await self.read_new(count, None)
        if not got and await self._batch.promote(count):
            got = await self.read_new(count, None)
        if got or block_ms is None:
            return got
        return await self.read_new(count, block_ms)

    def block_ms(self, limit_ms: int) -> int:
        """How long a read of new entries may block: ``limit_ms``, but never past the next
        sweep (a blocked read would otherwise hold an orphan back by up to ``limit_ms``)."""
        until_sweep_s = max(0.0, self._claim_due - time.monotonic())
        return max(1, min(limit_ms, int(until_sweep_s * 1000)))  # (BLOCK 0 would block for ever)

    async def autoclaim(self, count: int) -> list[Entry]:
        """Take over up to ``count`` entries idle past the claim limit on any consumer: a
        sweep at most every ``autoclaim_s`` (no round trip in between), except that a sweep
        which did not reach the stream's end is continued at the next call."""
        now = time.monotonic()
        if now < self._claim_due:
            return []
        resp = await self.r.xautoclaim(
            self.stream,
            keys.JOBS_GROUP,
            self.consumer,
            min_idle_time=self.claim_idle_ms,
            start_id=self._claim_cursor,
            count=count,
        )
        cursor, claimed = resp[0], resp[1]
        self._claim_cursor = cursor.decode() if isinstance(cursor, bytes) else str(cursor)
        if self._claim_cursor == "0-0":  # the sweep reached the end: the next one is due later
            self._claim_due = now + self.autoclaim_s
        return [(eid, fields) for eid, fields in claimed if fields is not None]

    async def ack(self, *entry_ids: bytes) -> None:
        """Acknowledge and delete entries: a handled job leaves the stream (bounded storage)."""
        if entry_ids:
            async with self.r.pipeline(transaction=True) as pipe:
                pipe.xack(self.stream, keys.JOBS_GROUP, *entry_ids)
                pipe.xdel(self.stream, *entry_ids)
                await pipe.execute()

    async def dead_letter(self, entry_id: bytes, fields: dict[Any, Any], reason: str) -> None:
        """Copy the entry, with the reason, to the dead-letter stream, then acknowledge it."""
        record: dict[Any, Any] = dict(fields)
        record.update(
            {
                b"reason": reason.encode(),
                b"entry_id": entry_id,
                b"worker_id": self.consumer.encode(),
                b"ts": repr(time.time()).encode(),
            }
        )
        async with self.r.pipeline(transaction=True) as pipe:
            pipe.xadd(self.dead_letters, record, maxlen=keys.DEAD_LETTER_MAXLEN, approximate=True)
            pipe.xack(self.stream, keys.JOBS_GROUP, entry_id)
            pipe.xdel(self.stream, entry_id)
            await pipe.execute()


def guess_job_id(fields: dict[Any, Any]) -> str | None:
    """The job id inside an entry that failed to decode, when one can be found."""
    raw = fields.get(codec.FIELD, fields.get(codec.FIELD.decode()))
    if not isinstance(raw, bytes | bytearray | str):
        return None
    try:
        body = msgpack.unpackb(raw.encode() if isinstance(raw, str) else bytes(raw), raw=False)
        job_id = body["d"]["job_id"]
    except Exception:  # anything malformed simply has no recoverable id
        return None
    return job_id if isinstance(job_id, str) and 0 < len(job_id) <= 128 else None
