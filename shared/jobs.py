"""The job record: one hash per job, written by the gateway and the workers.

The gateway creates it (status ``queued``) before it enqueues the job; the worker running
the job moves it on and stores the final event under ``result``. Event streams and the hash
expire ``keys.JOB_TTL_S`` after their last write.
"""

from __future__ import annotations

from enum import StrEnum

import redis.asyncio as aioredis

from shared import codec, keys
from shared.schemas import ErrorEvent, FinishEvent, FinishReason, JobEvent


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    FINISHED = "finished"
    CANCELLED = "cancelled"
    FAILED = "failed"


TERMINAL = frozenset({JobStatus.FINISHED, JobStatus.CANCELLED, JobStatus.FAILED})

# Fields of the job hash.
STATUS = "status"
CREATED_AT = "created_at"
WORKER = "worker"
ATTEMPTS = "attempts"  # how many times a worker started the job (a hand-back on drain is not counted)
LEASE = "lease"  # incremented at every start: the fence of the worker running it (worker/leases.py)
OWNER = "owner"  # the API key that submitted the job (a hash of it), when keys are configured
RESULT = "result"  # the encoded FinishEvent or ErrorEvent that ended the job


def status_of(raw: bytes | str | None) -> JobStatus | None:
    if raw is None:
        return None
    return JobStatus(raw.decode() if isinstance(raw, bytes) else raw)


def is_over(raw: bytes | str | None) -> bool:
    """Whether a job whose hash holds status ``raw`` is over: terminal, or gone (no hash: it
    expired); an unknown status is not over."""
    try:
        status = status_of(raw)
    except ValueError:
        return False
    return status is None or status in TERMINAL


def terminal_status(event: FinishEvent | ErrorEvent) -> JobStatus:
    if isinstance(event, ErrorEvent):
        return JobStatus.FAILED
    return JobStatus.CANCELLED if event.finish_reason == FinishReason.CANCELLED else JobStatus.FINISHED


def add_events(
    pipe: aioredis.client.Pipeline,
    job_id: str,
    events: list[JobEvent],
    ttl_s: int = keys.JOB_TTL_S,
    *,
    model: str,
) -> None:
    """Queue XADDs of ``events`` on the job's stream (and renew its TTL) in ``pipe``."""
    stream = keys.job_events(model, job_id)
    for ev in events:
        pipe.xadd(stream, codec.entry(ev))
    pipe.expire(stream, ttl_s)


def add_result(
    pipe: aioredis.client.Pipeline,
    event: FinishEvent | ErrorEvent,
    ttl_s: int = keys.JOB_TTL_S,
    *,
    model: str,
) -> None:
    """Queue the final event on the job's stream and in its hash, and the job's entry on
    the model's finished stream, in ``pipe`` (as the worker's write script does)."""
    add_events(pipe, event.job_id, [event], ttl_s, model=model)
    key = keys.job_key(model, event.job_id)
    pipe.hset(key, mapping={STATUS: terminal_status(event).value, RESULT: codec.encode(event)})
    pipe.expire(key, ttl_s)
    pipe.xadd(
        keys.finished_stream(model),
        {b"j": event.job_id.encode()},
        maxlen=keys.FINISHED_MAXLEN,
        approximate=True,
    )
