"""Fenced writes: only the worker holding a job's lease changes its record."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from shared import codec, jobs, keys
from shared.schemas import FinishEvent, TokenEvent
from shared.streams import ensure_group
from worker.leases import JobWrite, Leases, NotStarted

pytestmark = pytest.mark.anyio
M = "tiny"  # the served model name of these tests' workers


async def _pending_job(r: aioredis.Redis, job_id: str, consumer: str) -> bytes:
    await ensure_group(r, keys.jobs_stream(M), keys.JOBS_GROUP)
    await r.hset(keys.job_key(M, job_id), jobs.STATUS, "queued")
    entry_id: bytes = await r.xadd(keys.jobs_stream(M), {b"m": b"job"})
    await r.xreadgroup(keys.JOBS_GROUP, consumer, {keys.jobs_stream(M): ">"})
    return entry_id


def _token(job_id: str, index: int) -> TokenEvent:
    return TokenEvent(job_id=job_id, index=index, token_ids=[7], text="x")


def _final(job_id: str) -> FinishEvent:
    return FinishEvent(
        job_id=job_id, finish_reason="stop", text="x", token_ids=[7], prompt_tokens=1, completion_tokens=1
    )


async def test_only_the_newest_lease_writes(r: aioredis.Redis) -> None:
    entry = await _pending_job(r, "j", "w1")
    old, new = Leases(r, "w1", 60, model=M), Leases(r, "w2", 60, model=M)
    lease1, attempts1 = await old.start("j")
    assert (lease1, attempts1) == (1, 1)
    assert await old.write([JobWrite("j", lease1, entry, [_token("j", 0)])]) == [True]
    lease2, attempts2 = await new.start("j")  # w2 took the job over
    assert (lease2, attempts2) == (2, 2)
    assert await old.write([JobWrite("j", lease1, entry, [_token("j", 1)], _final("j"))]) == [False]
    assert (
        await r.xlen(keys.job_events(M, "j")) == 1
        and await r.hget(keys.job_key(M, "j"), "status") == b"running"
    )
    assert await new.write([JobWrite("j", lease2, entry, [_token("j", 1)], _final("j"))]) == [True]
    assert await r.hget(keys.job_key(M, "j"), "status") == b"finished"
    assert codec.decode(await r.hget(keys.job_key(M, "j"), jobs.RESULT)) == _final("j")
    # The result, the acknowledgement and the deletion of the entry are one step.
    assert await r.xpending_range(keys.jobs_stream(M), keys.JOBS_GROUP, "-", "+", 10) == []
    assert await r.xlen(keys.jobs_stream(M)) == 0
    assert await new.start("j") == (NotStarted.ENDED, 0)  # an ended job is not started again


async def test_renewal_keeps_held_entries_and_reports_lost_ones(r: aioredis.Redis) -> None:
    held_entry = await _pending_job(r, "held", "w1")
    lost_entry = await _pending_job(r, "lost", "w1")
    w1 = Leases(r, "w1", 60, model=M)
    held, _ = await w1.start("held")
    lost, _ = await w1.start("lost")
    await Leases(r, "w2", 60, model=M).start("lost")
    got = await w1.renew([("held", held, held_entry), ("lost", lost, lost_entry)])
    assert got == ["lost"]
    pending = await r.xpending_range(keys.jobs_stream(M), keys.JOBS_GROUP, "-", "+", 10)
    idle = {p["message_id"]: p["time_since_delivered"] for p in pending}
    assert idle[held_entry] < 1000


async def test_a_cancelled_job_is_not_started(r: aioredis.Redis) -> None:
    await _pending_job(r, "c", "w1")
    await r.set(keys.job_cancel(M, "c"), b"1")
    lease, attempts = await Leases(r, "w1", 60, model=M).start("c")
    assert lease is NotStarted.CANCELLED and attempts == 0


async def test_hand_back_makes_the_entry_claimable_at_once_without_counting_a_start(
    r: aioredis.Redis,
) -> None:
    entry = await _pending_job(r, "h", "w1")
    w1 = Leases(r, "w1", 60, model=M)
    lease, _ = await w1.start("h")
    assert await w1.hand_back("h", lease, entry, idle_ms=60_000)
    assert await r.hget(keys.job_key(M, "h"), jobs.STATUS) == b"queued"
    assert await r.hget(keys.job_key(M, "h"), jobs.ATTEMPTS) == b"0"
    claimed = await r.xautoclaim(keys.jobs_stream(M), keys.JOBS_GROUP, "w2", min_idle_time=30_000)
    assert [eid for eid, _ in claimed[1]] == [entry]


async def test_one_batch_writes_the_held_jobs_and_skips_the_lost_one(r: aioredis.Redis) -> None:
    entries = {j: await _pending_job(r, j, "w1") for j in ("a", "b", "c")}
    w1 = Leases(r, "w1", 60, model=M)
    leases = {j: (await w1.start(j))[0] for j in entries}
    await Leases(r, "w2", 60, model=M).start("b")  # b was taken over
    batch = [
        JobWrite("a", leases["a"], entries["a"], [_token("a", 0), _token("a", 1)]),
        JobWrite("b", leases["b"], entries["b"], [_token("b", 0)], _final("b")),
        JobWrite("c", leases["c"], entries["c"], [], _final("c")),
    ]
    assert await w1.write(batch) == [True, False, True]
    assert [await r.xlen(keys.job_events(M, j)) for j in "abc"] == [2, 0, 1]
    assert [await r.hget(keys.job_key(M, j), jobs.STATUS) for j in "abc"] == [
        b"running",
        b"running",
        b"finished",
    ]
    pending = {
        p["message_id"] for p in await r.xpending_range(keys.jobs_stream(M), keys.JOBS_GROUP, "-", "+", 10)
    }
    assert pending == {entries["a"], entries["b"]}


async def test_a_retried_write_whose_first_try_landed_is_not_written_again(r: aioredis.Redis) -> None:
    entry = await _pending_job(r, "j", "w1")
    w1 = Leases(r, "w1", 60, model=M)
    lease, _ = await w1.start("j")
    write = JobWrite("j", lease, entry, [_token("j", 0)], seq=1)
    assert await w1.write([write]) == [True]
    assert await w1.write([write]) == [True]  # the same batch again: its reply was lost
    assert await r.xlen(keys.job_events(M, "j")) == 1
    assert await w1.write([JobWrite("j", lease, entry, [_token("j", 1)], seq=2)]) == [True]
    assert await r.xlen(keys.job_events(M, "j")) == 2
    w2 = Leases(r, "w2", 60, model=M)
    lease2, _ = await w2.start("j")  # a new lease counts from 0 again
    assert await w2.write([JobWrite("j", lease2, entry, [_token("j", 2)], seq=1)]) == [True]
    assert await r.xlen(keys.job_events(M, "j")) == 3
