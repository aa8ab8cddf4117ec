"""Atomic admission of a list of jobs (``POST /v1/jobs`` with a JSON array): one Lua script
admits every job of the list or none.

The script first looks at every job id: one that exists with the same owner and fingerprint
is the same job (a retried list: kept, not enqueued again); one that exists otherwise is a
409 for the whole list (nothing written). Then, per stream, the new jobs must fit: the
group's load plus the list's new jobs on that stream at most ``max_queue`` (a single submit
is the case of one: load < limit), else the whole list is refused (429, nothing written).
Only then are the new jobs written and enqueued.

Every key of one model carries the model's hash tag: a list for one model is one Redis
Cluster slot. A list spanning several models is one script on a single Redis; on Redis
Cluster (keys in several slots) it is refused with a 400.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from gateway.admission import FINGERPRINT, LOAD_LUA, OWNER, hash_fields
from gateway.errors import APIError
from shared import codec, jobs, keys
from shared.errors import ErrorCode
from shared.schemas import JobRequest

if TYPE_CHECKING:
    from typing import Any as JobStore  # gateway.store.JobStore, which imports this module


@dataclass(frozen=True)
class Submitted:
    """A submit's outcome: the job (as enqueued, or the one already there) and whether this
    call enqueued it."""

    job_id: str
    created: bool
    status: str


# KEYS: the n job hashes, the m distinct streams, then their m batch-inflight sets. ARGV:
# group, max_queue, ttl_s, entry field, the fingerprint / owner / status field names, n,
# the owner; then per job: its stream's number (1..m), its fingerprint, its entry payload,
# the count of its hash's field/value arguments, those arguments.
LIST_LUA = (
    LOAD_LUA
    + """
local n = tonumber(ARGV[8])
local limit = tonumber(ARGV[2])
local items = {}
local pos = 10
for i = 1, n do
  local nf = tonumber(ARGV[pos + 3])
  items[i] = {stream = tonumber(ARGV[pos]), fp = ARGV[pos + 1], payload = ARGV[pos + 2],
              first = pos + 4, nf = nf}
  pos = pos + 4 + nf
end
local exists = {}
local want = {}
for i = 1, n do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    local got = redis.call('HMGET', KEYS[i], ARGV[5], ARGV[6], ARGV[7])
    if (got[1] or '') ~= items[i].fp or (got[2] or '') ~= ARGV[9] then
      return {'conflict', tostring(i - 1)}
    end
    exists[i] = got[3] or ''
  else
    want[items[i].stream] = (want[items[i].stream] or 0) + 1
  end
end
for s, k in pairs(want) do
  local load = stream_load(KEYS[n + s], ARGV[1], limit, KEYS[n + (#KEYS - n) / 2 + s])
  if load + k > limit then
    return {'full', tostring(load), tostring(k)}
  end
end
local out = {'ok'}
for i = 1, n do
  if exists[i] then
    out[#out + 1] = 'exists:' .. exists[i]
  else
    local it = items[i]
    local fields = {}
    for j = it.first, it.first + it.nf - 1 do fields[#fields + 1] = ARGV[j] end
    redis.call('HSET', KEYS[i], unpack(fields))
    redis.call('EXPIRE', KEYS[i], ARGV[3])
    redis.call('XADD', KEYS[n + it.stream], '*', ARGV[4], it.payload)
    out[#out + 1] = 'created'
  end
end
return out
"""
)


@dataclass(frozen=True)
class ListAdmitted:
    """The script's answer: ``outcome`` ok (``statuses[i]``: None for a job this call
    enqueued, else the stored status of the same job already there), full (``load`` jobs on
    the fullest stream, ``wanted`` more asked: nothing written) or conflict (job ``index``
    exists with another owner or request: nothing written)."""

    outcome: str
    statuses: tuple[str | None, ...] = ()
    load: int = 0
    wanted: int = 0
    index: int = 0


class ListAdmission:
    def __init__(self, r: aioredis.Redis) -> None:
        self._script = r.register_script(LIST_LUA)

    async def submit(
        self,
        batch: list[tuple[JobRequest, str]],
        *,
        max_queue: int,
        ttl_s: float,
        owner: str,
    ) -> ListAdmitted:
        """Admit every ``(job, fingerprint)`` of ``batch`` on its model's job stream, or none."""
        streams: list[str] = []
        models: list[str] = []
        args: list[str | bytes | int] = [
            keys.JOBS_GROUP,
            max_queue,
            max(1, int(ttl_s)),
            codec.FIELD,
            FINGERPRINT,
            OWNER,
            jobs.STATUS,
            len(batch),
            owner,
        ]
        for job, fp in batch:
            stream = keys.jobs_stream(job.model)
            if stream not in streams:
                streams.append(stream)
                models.append(job.model)
            fields = hash_fields(job, owner, fp)
            args += [streams.index(stream) + 1, fp, codec.encode(job), len(fields), *fields]
        script_keys = [keys.job_key(job.model, job.job_id) for job, _ in batch] + streams
        script_keys += [keys.batch_inflight(m) for m in models]
        reply = await self._script(keys=script_keys, args=args)
        outcome = _text(reply[0])
        if outcome == "full":
            return ListAdmitted("full", load=int(_text(reply[1])), wanted=int(_text(reply[2])))
        if outcome == "conflict":
            return ListAdmitted("conflict", index=int(_text(reply[1])))
        statuses = tuple(
            None if _text(x) == "created" else _text(x).removeprefix("exists:") for x in reply[1:]
        )
        return ListAdmitted("ok", statuses=statuses)


async def submit_list(store: JobStore, batch: list[tuple[JobRequest, str]], owner: str) -> list[Submitted]:
    """Admit the list's jobs (each with its request's fingerprint) all at once, or refuse
    the whole list: 429 when they do not all fit the queue, 409 when one of their ids is
    another request's; nothing is enqueued then. A job already there (a retried list) is
    returned as it is, not enqueued again."""

    if len({job.model for job, _ in batch}) > 1 and isinstance(store.r, RedisCluster):
        raise APIError.of(
            ErrorCode.BAD_REQUEST, "the jobs of one list must go to one model on this server", param="model"
        )
    ttl = max(1, int(store.settings.result_ttl_s))
    async with store.r.pipeline(transaction=False) as pipe:  # bind each id to its model
        for job, _ in batch:
            pipe.set(keys.job_model(job.job_id), job.model.encode(), nx=True, ex=ttl)
            pipe.get(keys.job_model(job.job_id))
        bound = (await pipe.execute())[1::2]
    for (job, _), model in zip(batch, bound, strict=True):
        if model is not None and _text(model) != job.model:
            raise APIError.of(
                ErrorCode.CONFLICT,
                f"job id {job.job_id} (or its Idempotency-Key) is already used for another model",
                param="id",
            )
    got = await store.list_admission.submit(
        batch, max_queue=store.max_queue, ttl_s=store.settings.result_ttl_s, owner=owner
    )
    if got.outcome == "full":
        raise APIError.of(
            ErrorCode.QUEUE_FULL,
            f"server busy: {got.load} jobs queued; the list's {got.wanted} do not fit (limit "
            f"{store.max_queue}); nothing was enqueued",
        )
    if got.outcome == "conflict":
        job_id = batch[got.index][0].job_id
        raise APIError.of(
            ErrorCode.CONFLICT,
            f"job id {job_id} (or its Idempotency-Key) is already used for another request",
            param=f"{got.index}.id",
        )
    out, confirm = [], {keys.owner_jobs(owner): ttl}
    async with store.r.pipeline(transaction=False) as pipe:
        for (job, _), status in zip(batch, got.statuses, strict=True):
            store.remember(job.job_id, job.model)
            if status is None:
                store.index(pipe, job, owner)
                confirm[keys.job_model(job.job_id)] = ttl
                confirm[keys.job_key(job.model, job.job_id)] = ttl
            out.append(
                Submitted(job.job_id, created=status is None, status=status or jobs.JobStatus.QUEUED.value)
            )
        await pipe.execute()
    await store.replicas.confirm(confirm)
    return out


def _text(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
