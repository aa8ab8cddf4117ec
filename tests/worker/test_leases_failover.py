"""The fence when a Redis failover lost writes its master had acknowledged.

Replication is asynchronous: the replica promoted may lack a master's last writes. These
tests put the embedded store in the state such a promotion leaves and check that the worker
that wrote them gives the job up (its writes answer "lost") instead of writing beside
another worker or over a gap; the job is then re-run from what Redis holds.
"""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from shared import codec, jobs, keys
from shared.schemas import JobRequest, SamplingParams, TokenEvent
from shared.streams import ensure_group
from worker.leases import JobWrite, Leases

pytestmark = pytest.mark.anyio
M = "m"


async def _job(r: aioredis.Redis, job_id: str) -> bytes:
    await ensure_group(r, keys.jobs_stream(M), keys.JOBS_GROUP)
    job = JobRequest(job_id=job_id, model=M, prompt="p", params=SamplingParams(max_tokens=8))
    await r.hset(keys.job_key(M, job_id), mapping={jobs.STATUS: "queued"})
    return await r.xadd(keys.jobs_stream(M), codec.entry(job))


def _tok(job_id: str, i: int) -> TokenEvent:
    return TokenEvent(job_id=job_id, index=i, token_ids=[100 + i], text=f"t{i}")


async def test_a_lost_start_does_not_let_two_workers_write_under_one_lease(r: aioredis.Redis) -> None:
    entry = await _job(r, "j")
    before = await r.hgetall(keys.job_key(M, "j"))
    a, b = Leases(r, "wA", 60, model=M), Leases(r, "wB", 60, model=M)
    lease_a, _ = await a.start("j")
    # The failover lost wA's start: the promoted replica holds the record as it was before.
    await r.delete(keys.job_key(M, "j"))
    await r.hset(keys.job_key(M, "j"), mapping=before)
    lease_b, _ = await b.start("j")  # the entry came back undelivered: wB starts the job
    assert lease_b == lease_a  # the same lease number: only the worker's name tells them apart
    assert await a.write([JobWrite("j", lease_a, entry, [_tok("j", 0)], seq=1)]) == [False]
    assert await b.write([JobWrite("j", lease_b, entry, [_tok("j", 0)], seq=1)]) == [True]
    assert await a.renew([("j", lease_a, entry)]) == ["j"]  # wA finds the job lost here too
    assert not await a.hand_back("j", lease_a, entry, 1)
    assert await r.xlen(keys.job_events(M, "j")) == 1


async def test_a_lost_write_is_not_followed_by_a_gap(r: aioredis.Redis) -> None:
    entry = await _job(r, "j")
    w = Leases(r, "wA", 60, model=M)
    lease, _ = await w.start("j")
    assert await w.write([JobWrite("j", lease, entry, [_tok("j", 0)], seq=1)]) == [True]
    assert await w.write([JobWrite("j", lease, entry, [_tok("j", 1)], seq=2)]) == [True]
    # The failover lost write 2: its event and its number.
    (last_id, _), *_ = await r.xrevrange(keys.job_events(M, "j"), count=1)
    await r.xdel(keys.job_events(M, "j"), last_id)
    await r.hset(keys.job_key(M, "j"), "wseq", 1)
    assert await w.write([JobWrite("j", lease, entry, [_tok("j", 2)], seq=3)]) == [False]
    events = [codec.from_entry(f) for _, f in await r.xrange(keys.job_events(M, "j"))]
    assert [e.index for e in events if isinstance(e, TokenEvent)] == [0]  # no token 2 after a hole
    # The job is re-run from what Redis holds: a new start, counting its writes from 1.
    lease2, attempts = await Leases(r, "wB", 60, model=M).start("j")
    assert lease2 == lease + 1 and attempts == 2
