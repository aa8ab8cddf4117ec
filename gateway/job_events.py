"""Reading a job's events, live, for as long as a client follows it: the part of the
gateway's store (gateway/store.py ``JobStore``) that follows event streams (through the hub,
gateway/hub.py), rides out Redis outages (gateway/outage.py) and sends each output position
once (gateway/dedup.py)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio

from gateway.dedup import SentMark
from gateway.hub import EventHub, Subscription
from gateway.outage import OutageStats, resumed
from gateway.settings import GatewaySettings
from shared import codec, keys
from shared.schemas import ErrorEvent, FinishEvent, Message
from shared.streams import id_str

if TYPE_CHECKING:
    import redis.asyncio as aioredis

_ENTRY_ID = re.compile(r"^\d{1,20}-\d{1,20}$")


def valid_event_id(value: str) -> bool:
    return bool(_ENTRY_ID.match(value))


@dataclass(frozen=True)
class StoredEvent:
    """One entry of a job's event stream."""

    id: str
    msg: Message


class JobEvents:
    """``events``: a job's events as a client follows them (JobStore's; it gives what these
    read with)."""

    if TYPE_CHECKING:
        r: aioredis.Redis
        settings: GatewaySettings
        hub: EventHub
        outages: OutageStats

        async def model_of(self, job_id: str) -> str | None: ...

        async def ended(self, job_id: str) -> bool: ...

    async def events(
        self,
        job_id: str,
        after: str = "0-0",
        block_s: float = 15.0,
        until: float | None = None,
        *,
        final_only: bool = False,
        history: bool = False,
    ) -> AsyncIterator[StoredEvent | None]:
        """The job's events from just after ``after``, live, until its final one (with
        ``final_only``, as a rule only that one; with ``history`` too, every event of the job
        at once when it ends, the final one last: see gateway/hub.py).

        Yields None whenever ``block_s`` passes without an event (time for a keep-alive),
        and by ``until`` (an ``anyio.current_time()`` deadline) at the latest.
        Ends without a final event when the job is over and nothing is left after ``after``
        (a Last-Event-ID past the end), so no stream of a finished job runs forever.
        Rides out a Redis outage of up to ``outage_grace_s``, resuming after the last event
        delivered (gateway/outage.py); a longer one raises its Redis error. No output
        position is sent twice, across resumes too (gateway/dedup.py).
        """
        mark = SentMark(primed=after == "0-0")  # kept across the resumed reads

        def read(cursor: str) -> AsyncIterator[StoredEvent | None]:
            return self._events(job_id, cursor, block_s, until, mark, final_only=final_only, history=history)

        async for item in resumed(
            read,
            after,
            grace_s=self.settings.outage_grace_s,
            block_s=block_s,
            until=until,
            what=f"job {job_id}",
            stats=self.outages,
        ):
            yield item

    async def _events(
        self,
        job_id: str,
        after: str,
        block_s: float,
        until: float | None,
        mark: SentMark,
        *,
        final_only: bool,
        history: bool,
    ) -> AsyncIterator[StoredEvent | None]:
        """``events`` while Redis answers (its first error ends it)."""
        model = await self.model_of(job_id)
        if model is None:
            return
        stream = keys.job_events(model, job_id)
        if not mark.primed:  # a Last-Event-ID: what the client was sent before it
            for _, fields in await self.r.xrange(stream, "-", after) or []:
                try:
                    mark.see(codec.from_entry(dict(fields or {})))
                except codec.CodecError:
                    continue
            mark.primed = True
        # A final-only reader's job status is looked at by the hub as it follows the job.
        ended = False if final_only else await self.ended(job_id)
        # One blocked read for all followed streams.
        sub = self.hub.subscribe(model, stream, job_id if final_only else None, history=history)
        try:
            async for item in self._follow(job_id, sub, after, ended, block_s, until, mark):
                yield item
        finally:
            sub.close()

    async def _follow(
        self,
        job_id: str,
        sub: Subscription,
        after: str,
        ended: bool,
        block_s: float,
        until: float | None,
        mark: SentMark,
    ) -> AsyncIterator[StoredEvent | None]:
        if sub.final_of is not None:
            await sub.start(after)  # the hub looks at the job's status as it follows it
            ended = ended or sub.over
        while True:
            block: int | None = None
            if not ended:
                wait_s = block_s if until is None else min(block_s, until - anyio.current_time())
                block = max(1, int(wait_s * 1000))
            got = await sub.read(after, block)
            if not got:
                if ended:
                    return  # over, and nothing after the cursor
                if await self.ended(job_id):
                    ended = True  # one more read: the final event may have just landed
                    continue
                yield None
                continue
            for entry_id, fields in got:
                after = id_str(entry_id)
                try:
                    msg = codec.from_entry(fields)
                except codec.CodecError:
                    continue  # not ours to judge; the worker wrote it
                # Positions sent already are not sent again: a re-run wrote them again because
                # a Redis failover lost the writes this reader had been sent (worker/leases.py).
                new = mark.unseen(msg)
                if new is None:
                    continue
                msg = new
                yield StoredEvent(after, msg)
                if isinstance(msg, FinishEvent | ErrorEvent):
                    return
