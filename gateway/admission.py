"""Atomic admission: one Lua script checks the queue and enqueues the job, or does nothing.

The script runs as one unit on Redis (real or embedded), so the ``max_queue`` limit holds
under any concurrency, and an interrupted submit has either fully happened (job record and
stream entry) or not at all. A job id that already exists is not enqueued again: the script
reports the stored owner and fingerprint, which makes a retried submit (same Idempotency-Key,
same client-chosen id, or a client library's own retry of the script) return the same job.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from shared import codec, jobs, keys
from shared.schemas import JobRequest

# Fields of the job hash that the gateway writes and reads.
OWNER = jobs.OWNER  # a digest of the API key that made the job ("" when the gateway is open)
FINGERPRINT = "fingerprint"  # digest of the request: a reused id with another body is a 409
MODEL = "model"  # the served model whose queue holds the job
METADATA = "metadata"  # the client's metadata (JSON), returned by GET /v1/jobs/{id}

# The load of a stream's group (pending + lag): the jobs running plus waiting for a worker.
# Creates the group (from 0, so queued jobs count as lag) when no worker ever started.
LOAD_LUA = """
local function stream_load(stream, group, limit, inflight)
  if not inflight then  -- the batch band: no group reads it, every entry waits
    return redis.call('XLEN', stream)
  end
  -- Batch entries a worker moved onto the live stream are not live load (keys.batch_inflight).
  local moved = 0
  for _, id in ipairs(redis.call('SMEMBERS', inflight)) do
    if #redis.call('XRANGE', stream, id, id) > 0 then
      moved = moved + 1
    else
      redis.call('SREM', inflight, id)
    end
  end
  local ok, groups = pcall(redis.call, 'XINFO', 'GROUPS', stream)
  if ok then
    for _, g in ipairs(groups) do
      local t = {}
      for i = 1, #g, 2 do t[g[i]] = g[i + 1] end
      if t['name'] == group then
        local lag = t['lag']
        if not lag then  -- unknown after deletions: count the undelivered entries
          lag = #redis.call('XRANGE', stream, '(' .. t['last-delivered-id'], '+', 'COUNT', limit + 1)
        end
        return math.max(0, tonumber(t['pending']) + lag - moved)
      end
    end
    redis.call('XGROUP', 'CREATE', stream, group, '0')
  else
    redis.call('XGROUP', 'CREATE', stream, group, '0', 'MKSTREAM')
  end
  return math.max(0, redis.call('XLEN', stream) - moved)
end
"""

# KEYS: job hash, the model's job stream, its batch-inflight set (one hash tag; no third key:
# the stream is the batch band, whose load is its length). ARGV: group, max_queue, ttl_s,
# entry field, entry payload, the fingerprint / owner / status field names, then field,
# value pairs for the hash.
SUBMIT_LUA = (
    LOAD_LUA
    + """
if redis.call('EXISTS', KEYS[1]) == 1 then
  local got = redis.call('HMGET', KEYS[1], ARGV[6], ARGV[7], ARGV[8])
  return {'exists', got[1] or '', got[2] or '', got[3] or ''}
end
local limit = tonumber(ARGV[2])
local load = stream_load(KEYS[2], ARGV[1], limit, KEYS[3])
if load >= limit then
  return {'full', tostring(load)}
end
local fields = {}
for i = 9, #ARGV do fields[#fields + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('EXPIRE', KEYS[1], ARGV[3])
local id = redis.call('XADD', KEYS[2], '*', ARGV[4], ARGV[5])
return {'ok', id}
"""
)


@dataclass(frozen=True)
class Admitted:
    """The script's answer: ``outcome`` is ok (enqueued), full (load >= limit: nothing
    written) or exists (the id was taken: nothing written; the stored fields)."""

    outcome: str
    load: int = 0
    fingerprint: str = ""
    owner: str = ""
    status: str = ""


class Admission:
    def __init__(self, r: aioredis.Redis) -> None:
        self._script = r.register_script(SUBMIT_LUA)
        self.sha = hashlib.sha1(SUBMIT_LUA.encode()).hexdigest()

    async def submit(
        self,
        job: JobRequest,
        *,
        max_queue: int,
        ttl_s: float,
        owner: str,
        fingerprint: str,
        batch: bool = False,
    ) -> Admitted:
        """Admit ``job`` on its model's job stream, or (``batch``) on its batch band."""
        script_keys, args = _call(
            job, max_queue=max_queue, ttl_s=ttl_s, owner=owner, fingerprint=fingerprint, batch=batch
        )
        return parse(await self._script(keys=script_keys, args=args))

    def queue(
        self,
        pipe: aioredis.client.Pipeline,
        job: JobRequest,
        *,
        max_queue: int,
        ttl_s: float,
        owner: str,
        fingerprint: str,
    ) -> None:
        """The script's call queued in ``pipe`` by its digest (``parse`` reads its reply; a
        NOSCRIPT error reply means Redis does not hold the script yet: ``submit`` loads it)."""
        script_keys, args = _call(job, max_queue=max_queue, ttl_s=ttl_s, owner=owner, fingerprint=fingerprint)
        # execute_command, not ``pipe.evalsha``: redis-py's cluster pipeline blocks the
        # latter by name, yet routes an EVALSHA by its keys (one slot) like any command.
        pipe.execute_command("EVALSHA", self.sha, len(script_keys), *script_keys, *args)


def hash_fields(job: JobRequest, owner: str, fingerprint: str) -> list[str | bytes | int]:
    """The job hash's field, value pairs as the admission writes them."""
    args: list[str | bytes | int] = [
        jobs.STATUS,
        jobs.JobStatus.QUEUED.value,
        jobs.CREATED_AT,
        repr(job.created_at),
    ]
    args += [OWNER, owner, FINGERPRINT, fingerprint, MODEL, job.model]
    if job.metadata:
        args += [METADATA, json.dumps(job.metadata, ensure_ascii=False)]
    return args


def _call(
    job: JobRequest, *, max_queue: int, ttl_s: float, owner: str, fingerprint: str, batch: bool = False
) -> tuple[list[str], list[str | bytes | int]]:
    """The script's keys and arguments for ``job``."""
    args: list[str | bytes | int] = [
        keys.JOBS_GROUP,
        max_queue,
        max(1, int(ttl_s)),
        codec.FIELD,
        codec.encode(job),
        FINGERPRINT,
        OWNER,
        jobs.STATUS,
    ]
    args += hash_fields(job, owner, fingerprint)
    # Every key carries the model's hash tag: one Redis Cluster slot.
    if batch:
        return [keys.job_key(job.model, job.job_id), keys.batch_stream(job.model)], args
    return [
        keys.job_key(job.model, job.job_id),
        keys.jobs_stream(job.model),
        keys.batch_inflight(job.model),
    ], args


def parse(reply: list[Any]) -> Admitted:
    """The script's reply as an ``Admitted``."""
    outcome = _text(reply[0])
    if outcome == "full":
        return Admitted("full", load=int(_text(reply[1])))
    if outcome == "exists":
        return Admitted("exists", fingerprint=_text(reply[1]), owner=_text(reply[2]), status=_text(reply[3]))
    return Admitted("ok")


def _text(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
