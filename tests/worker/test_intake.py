from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio as aioredis

from shared import keys
from worker.intake import JobIntake, guess_job_id

pytestmark = pytest.mark.anyio
M = "tiny"  # the served model name of these tests' workers


async def _fill(r: aioredis.Redis, n: int) -> list[bytes]:
    return [await r.xadd(keys.jobs_stream(M), {b"m": b"%d" % i}) for i in range(n)]


async def test_own_pending_is_reread_before_new_entries(r: aioredis.Redis) -> None:
    ids = await _fill(r, 3)
    first = JobIntake(r, "w1", claim_idle_s=30, model=M)
    await first.setup()
    assert [e for e, _ in await first.read_new(2, None)] == ids[:2]
    # The same consumer restarted: its two unacknowledged entries come back first, in pages.
    again = JobIntake(r, "w1", claim_idle_s=30, model=M)
    assert [e for e, _ in await again.read_own_pending(1)] == ids[:1]
    assert [e for e, _ in await again.read_own_pending(5)] == ids[1:2]
    assert await again.read_own_pending(5) == []
    assert [e for e, _ in await again.read_new(5, None)] == ids[2:]


async def test_autoclaim_takes_over_idle_entries_of_a_dead_consumer(r: aioredis.Redis) -> None:
    ids = await _fill(r, 2)
    dead = JobIntake(r, "dead", claim_idle_s=30, model=M)
    await dead.setup()
    await dead.read_new(2, None)
    patient = JobIntake(r, "alive", claim_idle_s=30, model=M)
    assert await patient.autoclaim(5) == []  # not idle long enough yet
    eager = JobIntake(r, "alive", claim_idle_s=0, model=M)
    assert [e for e, _ in await eager.autoclaim(5)] == ids
    owners = {
        p["consumer"] for p in await r.xpending_range(keys.jobs_stream(M), keys.JOBS_GROUP, "-", "+", 10)
    }
    assert owners == {b"alive"}


async def test_autoclaim_sweeps_at_most_once_a_period(r: aioredis.Redis) -> None:
    ids = await _fill(r, 3)
    dead = JobIntake(r, "dead", claim_idle_s=30, model=M)
    await dead.setup()
    await dead.read_new(3, None)
    calls = 0
    xautoclaim = r.xautoclaim

    async def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return await xautoclaim(*args, **kwargs)

    r.xautoclaim = counted  # type: ignore[method-assign]
    sweeper = JobIntake(r, "alive", claim_idle_s=0, model=M, autoclaim_s=3600)
    # A sweep that stops short of the stream's end (count 2 of 3) goes on at the next call ...
    assert [e for e, _ in await sweeper.autoclaim(2)] == ids[:2]
    assert [e for e, _ in await sweeper.autoclaim(2)] == ids[2:]
    # ... one that reached the end waits for its period: no round trip in between.
    assert calls == 2
    assert await sweeper.autoclaim(2) == []
    assert calls == 2


async def test_a_read_of_new_entries_never_blocks_past_the_next_sweep(r: aioredis.Redis) -> None:
    """An orphan waits for the next sweep, not for the end of a blocked read as well."""
    intake = JobIntake(r, "alive", claim_idle_s=30, model=M, autoclaim_s=0.5)
    await intake.setup()
    assert intake.block_ms(2000) == 1  # no sweep yet: it is due now
    await intake.autoclaim(5)  # swept to the end: the next one is due in 0.5 s
    assert 1 <= intake.block_ms(2000) <= 500
    assert intake.block_ms(100) <= 100
    idle = JobIntake(r, "alive", claim_idle_s=30, model=M, autoclaim_s=3600)
    await idle.autoclaim(5)
    assert idle.block_ms(2000) == 2000  # a sweep far off leaves the read its full block


async def test_dead_letter_keeps_the_entry_and_reason_and_acks(r: aioredis.Redis) -> None:
    ids = await _fill(r, 1)
    intake = JobIntake(r, "w", claim_idle_s=30, model=M)
    await intake.setup()
    ((entry_id, fields),) = await intake.read_new(1, None)
    await intake.dead_letter(entry_id, fields, "bad")
    ((_, dead),) = await r.xrange(keys.dead_letter_stream(M))
    assert dead[b"m"] == b"0" and dead[b"reason"] == b"bad" and dead[b"entry_id"] == ids[0]
    assert await r.xpending_range(keys.jobs_stream(M), keys.JOBS_GROUP, "-", "+", 10) == []
    assert await r.xlen(keys.jobs_stream(M)) == 0  # a handled entry leaves the job stream


def test_guess_job_id() -> None:
    import msgpack

    assert guess_job_id({b"m": msgpack.packb({"v": 1, "t": "job", "d": {"job_id": "abc", "x": 1}})}) == "abc"
    assert guess_job_id({b"m": b"\xc1"}) is None
    assert guess_job_id({}) is None


async def test_a_worker_reads_only_its_models_stream(r: aioredis.Redis) -> None:
    await r.xadd(keys.jobs_stream("other"), {b"m": b"not for tiny"})
    mine = await _fill(r, 1)
    intake = JobIntake(r, "w", claim_idle_s=30, model=M)
    await intake.setup()
    got = await intake.read_new(10, None)
    assert [e for e, _ in got] == mine
    assert await r.xlen(keys.jobs_stream("other")) == 1


async def test_live_entries_are_read_before_batch_ones(r: aioredis.Redis) -> None:
    from shared.batch_band import BatchBand

    intake = JobIntake(r, "w1", claim_idle_s=30, model=M)
    await intake.setup()
    for i in range(3):
        await r.xadd(keys.batch_stream(M), {b"m": b"batch%d" % i})
    live = await _fill(r, 2)
    got = await intake.read_live_then_batch(5, None)
    assert [e for e, _ in got] == live  # the live ones; the batch jobs stay in their band
    assert await r.xlen(keys.batch_stream(M)) == 3
    got = await intake.read_live_then_batch(2, None)  # nothing live: 2 batch jobs (the free slots)
    assert [f[b"m"] for _, f in got] == [b"batch0", b"batch1"]
    assert await r.xlen(keys.batch_stream(M)) == 1
    assert await r.scard(keys.batch_inflight(M)) == 2
    assert await BatchBand(r, M).promote(0) == 0
