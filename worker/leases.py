"""Fenced writes: a worker changes a job's record only while it holds the job's lease.

Each start of a job increments the ``lease`` field of its hash (``shared.jobs.LEASE``) and
names the worker in ``worker``; the worker that started it keeps that number as its fence.
Every later write of that worker — token events, the result, the acknowledgement, a claim
renewal, a hand-back — runs as one Lua script that first checks the hash still holds its
number and its name. A worker that was paused past ``--claim-idle`` while another took the
job over therefore writes nothing more for it: its script answers "lost" and the worker drops
the job. The scripts run the same on a real Redis and on the embedded store (fakeredis with
Lua).

A Redis failover may lose the last writes a master acknowledged (replication is
asynchronous): a start, so that another worker starts the job again under the *same* lease
number — the name tells them apart —, or a write of events, so that the next one would leave
a gap — each write carries its number (``wseq``), and one that does not follow the last the
hash holds finds the job lost. Either way the job is given up here and re-run from the events
Redis does hold (tests/worker/test_leases_failover.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import cast

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline

from shared import codec, jobs, keys
from shared.schemas import ErrorEvent, FinishEvent, JobEvent
from shared.streams import id_str


class NotStarted(IntEnum):
    """What a start answers in place of a lease (every lease is > 0): the job was not started."""

    ENDED = 0  # it ended already (a result is written): just acknowledge the entry
    CANCELLED = -1  # it was cancelled before it started: end it as cancelled


# KEYS: per job its hash and cancel flag. ARGV: result TTL (s), worker id. Returns per job
# {lease, attempts} (flat) with the new lease, or {NotStarted.ENDED, 0} when the job already
# ended, or {NotStarted.CANCELLED, 0} when it was cancelled before it started. One call starts
# a whole batch of entries. The hash's status strings are shared.jobs.JobStatus values.
_START = """
local out = {}
for j = 1, #KEYS / 2 do
  local hash, cancel = KEYS[2 * j - 1], KEYS[2 * j]
  local status = redis.call('HGET', hash, 'status')
  if status == 'finished' or status == 'cancelled' or status == 'failed' then
    out[#out + 1] = ENDED; out[#out + 1] = 0
  elseif redis.call('EXISTS', cancel) == 1 then
    out[#out + 1] = CANCELLED; out[#out + 1] = 0
  else
    out[#out + 1] = redis.call('HINCRBY', hash, 'lease', 1)
    out[#out + 1] = redis.call('HINCRBY', hash, 'attempts', 1)
    redis.call('HSET', hash, 'status', 'running', 'worker', ARGV[2], 'wseq', 0)
    redis.call('EXPIRE', hash, ARGV[1])
  end
end
return out
""".replace("CANCELLED", str(int(NotStarted.CANCELLED))).replace("ENDED", str(int(NotStarted.ENDED)))

# KEYS: the jobs stream, the model's finished stream, then per job its hash and events
# stream. ARGV: TTL, worker id, group, n jobs, then two per job: a header
# ``lease seq ack status n len1 .. lenN job`` (words: the write number — a write at or below
# the hash's ``wseq`` was applied already and is skipped, so a retry after a lost reply
# repeats nothing, and one past ``wseq`` + 1 finds a write missing (lost in a failover): the
# job is lost here; 0 = none —, the entry id to ack and the final status, ``-`` when not
# final, the n events' byte lengths, the job id) and the n events' bytes one after the
# other. A final write's last event is the final one, and the job's result; the job's id
# then goes on the finished stream. One call writes a whole batch (a script call costs the
# embedded store ~1 ms, whatever it does), in two arguments a job (packing each argument
# costs the client too). Returns per job 1, or 0 (lost — another lease or worker holds the
# job, or a write of this lease is missing —: nothing written for it).
_WRITE = """
local ttl, worker, group = ARGV[1], ARGV[2], ARGV[3]
local out = {}
for j = 1, tonumber(ARGV[4]) do
  local hash, events = KEYS[2 * j + 1], KEYS[2 * j + 2]
  local h = {}
  for word in string.gmatch(ARGV[3 + 2 * j], '%S+') do h[#h + 1] = word end
  local blob = ARGV[4 + 2 * j]
  local lease, seq, ack, status, n = h[1], tonumber(h[2]), h[3], h[4], tonumber(h[5])
  local held = redis.call('HMGET', hash, 'lease', 'worker', 'wseq')
  local last = tonumber(held[3] or '0')
  if held[1] ~= lease or held[2] ~= worker then
    out[j] = 0
  elseif seq > 0 and last >= seq then
    out[j] = 1  -- applied already: a retry after a reply lost with the connection
  elseif seq > 1 and last < seq - 1 then
    out[j] = 0  -- an earlier write is missing (a failover lost it): give the job up
  else
    if seq > 0 then redis.call('HSET', hash, 'wseq', seq) end
    local pos, ev = 1, ''
    for i = 1, n do
      local len = tonumber(h[5 + i])
      ev = string.sub(blob, pos, pos + len - 1)
      pos = pos + len
      redis.call('XADD', events, '*', 'm', ev)
    end
    -- The TTL is set once and renewed with the result: every write wakes every blocked
    -- client of the embedded store, so a step makes as few as it can.
    if n > 0 and (status ~= '-' or redis.call('TTL', events) < 0) then
      redis.call('EXPIRE', events, ttl)
    end
    if status ~= '-' then
      redis.call('HSET', hash, 'status', status, 'worker', worker, 'result', ev)
      redis.call('EXPIRE', hash, ttl)
      redis.call('XADD', KEYS[2], 'MAXLEN', '~', FINISHED_MAXLEN, '*', 'j', h[6 + n])
    end
    if ack ~= '-' then
      redis.call('XACK', KEYS[1], group, ack)
      redis.call('XDEL', KEYS[1], ack)
    end
    out[j] = 1
  end
end
return out
""".replace("FINISHED_MAXLEN", str(keys.FINISHED_MAXLEN))

# KEYS: job hashes... ARGV: jobs stream, group, consumer (the worker), n, then n (lease, entry
# id) pairs. Renews the entries still held; returns the 1-based indexes of the jobs lost.
_RENEW = """
local lost = {}
local n = tonumber(ARGV[4])
for i = 1, n do
  local lease, entry = ARGV[3 + 2 * i], ARGV[4 + 2 * i]
  local held = redis.call('HMGET', KEYS[i], 'lease', 'worker')
  if held[1] == lease and held[2] == ARGV[3] then
    redis.call('XCLAIM', ARGV[1], ARGV[2], ARGV[3], 0, entry, 'JUSTID')
  else
    table.insert(lost, i)
  end
end
return lost
"""

# KEYS: job hash, jobs stream. ARGV: lease, group, entry id, idle ms, TTL, worker id.
# Gives a running job back: status queued again, the start not counted against
# max_deliveries, and the entry made idle so that any worker's XAUTOCLAIM takes it at once.
_HAND_BACK = """
local held = redis.call('HMGET', KEYS[1], 'lease', 'worker')
if held[1] ~= ARGV[1] or held[2] ~= ARGV[6] then return 0 end
redis.call('HSET', KEYS[1], 'status', 'queued')
redis.call('HINCRBY', KEYS[1], 'attempts', -1)
redis.call('EXPIRE', KEYS[1], ARGV[5])
redis.call('XCLAIM', KEYS[2], ARGV[2], 'handed-back', 0, ARGV[3], 'IDLE', ARGV[4], 'JUSTID')
return 1
"""


@dataclass
class JobWrite:
    """What one step (or several) has to write for one job, under the job's lease."""

    job_id: str
    lease: int
    entry_id: bytes
    events: list[JobEvent] = field(default_factory=list)
    final: FinishEvent | ErrorEvent | None = None
    seq: int = 0  # this lease's write number (the outbox numbers them; 0: not deduplicated)


class Leases:
    """The worker's fenced operations on job records (one instance per worker)."""

    def __init__(self, r: aioredis.Redis, worker_id: str, ttl_s: float, *, model: str) -> None:
        self.r = r
        self.worker_id = worker_id
        self.model = model  # every key a script touches carries this model's hash tag
        self.stream = keys.jobs_stream(model)
        self.finished = keys.finished_stream(model)
        self.ttl_s = max(1, int(ttl_s))
        self._start = r.register_script(_START)
        self._write = r.register_script(_WRITE)
        self._renew = r.register_script(_RENEW)
        self._hand_back = r.register_script(_HAND_BACK)

    async def start(self, job_id: str) -> tuple[int, int]:
        """Take the job's lease: (lease > 0, attempts counted so far), or (NotStarted.ENDED,
        0) when the job already ended, or (NotStarted.CANCELLED, 0) when it was cancelled
        before it started (``NotStarted`` is an IntEnum: it compares equal to 0 and -1)."""
        (got,) = await self.start_many([job_id])
        return got

    async def start_many(self, job_ids: list[str]) -> list[tuple[int, int]]:
        """``start`` for several jobs in one round trip, in order."""
        if not job_ids:
            return []
        script_keys = []
        for job_id in job_ids:
            script_keys += [keys.job_key(self.model, job_id), keys.job_cancel(self.model, job_id)]
        flat = [int(x) for x in await self._start(keys=script_keys, args=[self.ttl_s, self.worker_id])]
        leases = [lease if lease > 0 else NotStarted(lease) for lease in flat[0::2]]
        return list(zip(leases, flat[1::2], strict=True))

    async def write(self, batch: list[JobWrite]) -> list[bool]:
        """Write every job's events (and final result + ack) in one round trip; per job,
        whether it was still this worker's (False: lost, nothing written)."""
        if not batch:
            return []
        script_keys, args = self._write_call(batch)
        return self.held(await self._write(keys=script_keys, args=args))

    def queue_write(self, pipe: Pipeline, batch: list[JobWrite]) -> None:
        """The same write queued on ``pipe`` (by its SHA: a pipeline that loads scripts would
        first ask SCRIPT EXISTS, one more round trip); its reply goes to ``held``. A Redis
        that lost its scripts answers NOSCRIPT: then ``write`` (which loads it) is the retry."""
        script_keys, args = self._write_call(batch)
        # (execute_command: redis-py's cluster pipeline blocks ``pipe.evalsha`` by name.)
        pipe.execute_command("EVALSHA", self._write.sha, len(script_keys), *script_keys, *args)

    @staticmethod
    def held(reply: object) -> list[bool]:
        """The write script's reply: per job, whether it was still this worker's."""
        return [bool(x) for x in cast(list[int], reply)]

    def _write_call(self, batch: list[JobWrite]) -> tuple[list[str], list[bytes | str | int]]:
        script_keys = [self.stream, self.finished]
        args: list[bytes | str | int] = [self.ttl_s, self.worker_id, keys.JOBS_GROUP, len(batch)]
        for w in batch:
            script_keys += [keys.job_key(self.model, w.job_id), keys.job_events(self.model, w.job_id)]
            args += self._write_args(w)
        return script_keys, args

    async def renew(self, held: list[tuple[str, int, bytes]]) -> list[str]:
        """Renew the claims on (job id, lease, entry id); the job ids no longer held."""
        if not held:
            return []
        args: list[bytes | str | int] = [self.stream, keys.JOBS_GROUP, self.worker_id, len(held)]
        for _, lease, entry_id in held:
            args += [lease, entry_id]
        lost = await self._renew(keys=[keys.job_key(self.model, j) for j, _, _ in held], args=args)
        return [held[int(i) - 1][0] for i in lost or []]

    async def hand_back(self, job_id: str, lease: int, entry_id: bytes, idle_ms: int) -> bool:
        got = await self._hand_back(
            keys=[keys.job_key(self.model, job_id), self.stream],
            args=[lease, keys.JOBS_GROUP, entry_id, idle_ms, self.ttl_s, self.worker_id],
        )
        return bool(got)

    def _write_args(self, w: JobWrite) -> list[bytes | str | int]:
        events = [codec.encode(ev) for ev in w.events]
        if w.final is not None:
            events.append(codec.encode(w.final))  # also the result
            ack, status = id_str(w.entry_id), jobs.terminal_status(w.final).value
        else:
            ack = status = "-"
        lengths = " ".join(str(len(e)) for e in events)
        header = f"{w.lease} {w.seq} {ack} {status} {len(events)} {lengths} {w.job_id}"
        return [header, b"".join(events)]
