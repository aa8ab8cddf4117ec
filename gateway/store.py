"""The gateway's view of Redis: enqueue jobs, read their state and events, cancel them."""

from __future__ import annotations

import re
import secrets
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from gateway.errors import APIError
from shared import codec, jobs, keys
from shared.schemas import CancelRequest, ErrorEvent, FinishEvent, JobRequest, Message, WorkerInfo
from shared.streams import ensure_group, entries, group_load, id_str

CANCEL_MAXLEN = 10_000  # cancellations are only read live; a short history suffices
_ENTRY_ID = re.compile(r"^\d+-\d+$")


def new_job_id() -> str:
    return uuid.uuid4().hex


def valid_event_id(value: str) -> bool:
    return bool(_ENTRY_ID.match(value))


@dataclass(frozen=True)
class StoredEvent:
    """One entry of a job's event stream."""

    id: str
    msg: Message


class JobStore:
    def __init__(self, r: aioredis.Redis, max_queue: int) -> None:
        self.r = r
        self.max_queue = max_queue
        self._group_ready = False

    async def queue_load(self) -> int:
        """Jobs on the stream not yet acknowledged: running plus waiting for a worker."""
        pending, lag = await group_load(self.r, keys.JOBS_STREAM, keys.JOBS_GROUP)
        return pending + lag

    async def submit(self, job: JobRequest) -> JobRequest:
        """Enqueue ``job`` (429 past the backlog limit); an unseeded sampling job gets a seed
        so that a re-run after a worker failure reproduces the tokens a client already saw."""
        if not self._group_ready:
            # Created here too, so jobs accepted before any worker exists count as lag.
            await ensure_group(self.r, keys.JOBS_STREAM, keys.JOBS_GROUP)
            self._group_ready = True
        load = await self.queue_load()
        if load >= self.max_queue:
            raise APIError(
                429, f"server busy: {load} jobs queued (limit {self.max_queue})", code="queue_full"
            )
        if not job.params.greedy and job.params.seed is None:
            job = job.model_copy(
                update={"params": job.params.model_copy(update={"seed": secrets.randbits(63)})}
            )
        key = keys.job_key(job.job_id)
        async with self.r.pipeline(transaction=True) as pipe:
            pipe.hset(
                key, mapping={jobs.STATUS: jobs.JobStatus.QUEUED.value, jobs.CREATED_AT: job.created_at}
            )
            pipe.expire(key, keys.JOB_TTL_S)
            pipe.xadd(keys.JOBS_STREAM, codec.entry(job))  # never trimmed: trimming drops jobs
            await pipe.execute()
        return job

    async def info(self, job_id: str) -> dict[str, Any]:
        """Status and result of a job (404 when unknown or expired)."""
        raw = await self.r.hgetall(keys.job_key(job_id))
        if not raw:
            raise APIError(404, f"no job {job_id}", param="id", code="job_not_found")
        fields = {k.decode() if isinstance(k, bytes) else k: v for k, v in raw.items()}
        out: dict[str, Any] = {
            "id": job_id,
            "status": _text(fields.get(jobs.STATUS)),
            "attempts": int(fields.get(jobs.ATTEMPTS, 0)),
            "worker": _text(fields.get(jobs.WORKER)),
            "result": None,
            "error": None,
        }
        if jobs.RESULT in fields:
            final = codec.decode(_raw(fields[jobs.RESULT]))
            out["error" if isinstance(final, ErrorEvent) else "result"] = final.model_dump(mode="json")
        return out

    async def events(
        self, job_id: str, after: str = "0-0", block_s: float = 15.0
    ) -> AsyncIterator[StoredEvent | None]:
        """The job's events from just after ``after``, live, until its final one.

        Yields None whenever ``block_s`` passes without an event (time for a keep-alive).
        """
        stream = keys.job_events(job_id)
        while True:
            resp = await self.r.xread({stream: after}, count=256, block=int(block_s * 1000))
            got = entries(resp)
            if not got:
                yield None
                continue
            for entry_id, fields in got:
                after = id_str(entry_id)
                try:
                    msg = codec.from_entry(fields)
                except codec.CodecError:
                    continue  # not ours to judge; the worker wrote it
                yield StoredEvent(after, msg)
                if isinstance(msg, FinishEvent | ErrorEvent):
                    return

    async def wait(self, job_id: str) -> FinishEvent | ErrorEvent:
        async for ev in self.events(job_id):
            if ev is not None and isinstance(ev.msg, FinishEvent | ErrorEvent):
                return ev.msg
        raise AssertionError("unreachable: events() ends only after a final event")

    async def cancel(self, job_id: str) -> str:
        """Ask whichever worker has the job to stop it; returns the status afterwards."""
        status = jobs.status_of(await self.r.hget(keys.job_key(job_id), jobs.STATUS))
        if status is None:
            raise APIError(404, f"no job {job_id}", param="id", code="job_not_found")
        if status in jobs.TERMINAL:
            return status.value
        async with self.r.pipeline(transaction=True) as pipe:
            # The flag covers a job not yet taken; the broadcast reaches one already running.
            pipe.set(keys.job_cancel(job_id), b"1", ex=keys.JOB_TTL_S)
            pipe.xadd(
                keys.CANCEL_STREAM,
                codec.entry(CancelRequest(job_id=job_id)),
                maxlen=CANCEL_MAXLEN,
                approximate=True,
            )
            await pipe.execute()
        return "cancelling"

    async def workers(self, timeout_s: float) -> list[WorkerInfo]:
        """Workers that sent a heartbeat within ``timeout_s``."""
        now = time.time()
        alive = []
        for raw in (await self.r.hgetall(keys.WORKERS)).values():
            try:
                info = codec.decode_as(_raw(raw), WorkerInfo)
            except codec.CodecError:
                continue
            if info.is_alive(now, timeout_s):
                alive.append(info)
        return alive


def _raw(v: bytes | str) -> bytes:
    return v if isinstance(v, bytes) else v.encode()


def _text(v: Any) -> str | None:
    return v.decode() if isinstance(v, bytes) else v
