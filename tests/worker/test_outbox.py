"""The outbox: steps merged per job, token events coalesced, one round trip per write."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
import redis
import redis.asyncio as aioredis

from shared import codec, jobs, keys
from shared.control import StepStats
from shared.schemas import FinishEvent, JobEvent, Logprobs, StartEvent, TokenEvent
from shared.streams import ensure_group
from tests.conftest import flushed_redis
from worker.job_run import Resume
from worker.leases import JobWrite, Leases
from worker.outbox import Outbox, StepOutput, Written, coalesce, merge
from worker.telemetry import TelemetryPublisher

pytestmark = pytest.mark.anyio
M = "tiny"


def _tok(index: int, ids: list[int], text: str, **extra: Any) -> TokenEvent:
    return TokenEvent(job_id="j", index=index, token_ids=ids, text=text, **extra)


def _final(ids: list[int], text: str) -> FinishEvent:
    return FinishEvent(
        job_id="j", finish_reason="length", text=text, token_ids=ids, prompt_tokens=1,
        completion_tokens=len(ids),
    )  # fmt: skip


def _positions(events: list[JobEvent]) -> list[int]:
    return [ev.index + k for ev in events if isinstance(ev, TokenEvent) for k in range(len(ev.token_ids))]


def test_consecutive_token_events_become_one_with_every_position_once() -> None:
    start = StartEvent(job_id="j", worker_id="w")
    events: list[JobEvent] = [start, _tok(0, [5], "a"), _tok(1, [6, 7], "bc"), _tok(3, [], "d")]
    events.append(_tok(3, [8], ""))
    got = coalesce(events)
    assert got == [start, _tok(0, [5, 6, 7, 8], "abcd")]
    assert _positions(got) == _positions(events) == [0, 1, 2, 3]
    assert Resume.from_events(got) == Resume.from_events(events)


def test_only_continuing_plain_events_are_joined() -> None:
    gap = [_tok(0, [5], "a"), _tok(2, [6], "b")]  # not contiguous (a re-send overlaps, say)
    assert coalesce(list(gap)) == gap
    first = Logprobs(token_ids=[5], tokens=["a"], logprobs=[-0.1])
    second = Logprobs(token_ids=[6], tokens=["b"], logprobs=[-0.2])
    (joined,) = coalesce([_tok(0, [5], "a", logprobs=first), _tok(1, [6], "b", logprobs=second)])
    assert isinstance(joined, TokenEvent) and joined.logprobs == Logprobs.join([first, second])
    mixed = [_tok(0, [5], "a", logprobs=first), _tok(1, [6], "b")]  # logprobs must cover token_ids
    assert coalesce(list(mixed)) == mixed
    prompt = Logprobs(token_ids=[1], tokens=["p"], logprobs=[None])
    late = [_tok(0, [5], "a"), _tok(1, [6], "b", prompt_logprobs=prompt)]
    assert coalesce(list(late)) == late


def test_merge_coalesces_only_steps_that_piled_up() -> None:
    one = StepOutput([JobWrite("j", 1, b"1-0", [_tok(0, [5], "a")])], StepStats(step=1))
    assert merge([one])[0][0].events == [_tok(0, [5], "a")]
    two = StepOutput([JobWrite("j", 1, b"1-0", [_tok(1, [6], "b")], _final([5, 6], "ab"))], StepStats(step=2))
    other = StepOutput([JobWrite("k", 1, b"2-0", [_tok(0, [9], "z")])])
    writes, stats = merge([one, two, other])
    by_job = {w.job_id: w for w in writes}
    assert by_job["j"].events == [_tok(0, [5, 6], "ab")] and by_job["j"].final == _final([5, 6], "ab")
    assert by_job["k"].events == [_tok(0, [9], "z")]
    assert [s.step for s in stats] == [1, 2]


async def _range(r: aioredis.Redis, stream: str) -> list[tuple[bytes, dict[Any, Any]]]:
    got: Any = await r.xrange(stream)
    return list(got)


async def _outbox(r: aioredis.Redis, landed: list[Written]) -> tuple[Outbox, Leases, int, bytes]:
    await ensure_group(r, keys.jobs_stream(M), keys.JOBS_GROUP)
    await r.hset(keys.job_key(M, "j"), jobs.STATUS, "queued")
    entry: Any = await r.xadd(keys.jobs_stream(M), {b"m": b"job"})
    await r.xreadgroup(keys.JOBS_GROUP, "w", {keys.jobs_stream(M): ">"})
    leases = Leases(r, "w", 60, model=M)
    lease, _ = await leases.start("j")
    telemetry = TelemetryPublisher(r, "w", 60.0, model=M)
    return Outbox(leases, telemetry, landed.extend, lambda: (3, False)), leases, lease, entry


async def test_job_writes_and_telemetry_land_together_and_a_lost_script_is_loaded_again(
    r: aioredis.Redis,
) -> None:
    landed: list[Written] = []
    outbox, _, lease, entry = await _outbox(r, landed)
    await r.script_flush()  # (as after a Redis restart): the first write finds no script
    writes = [JobWrite("j", lease, entry, [_tok(0, [5], "a")])]
    assert await outbox._write(writes, [StepStats(step=1, batch_size=1)]) == [True]
    final = [JobWrite("j", lease, entry, [_tok(1, [6], "b")], _final([5, 6], "ab"))]
    assert await outbox._write(final, [StepStats(step=2, batch_size=1)]) == [True]
    assert outbox.retries == 0  # a missing script is no Redis error
    got = [codec.from_entry(f) for _, f in await _range(r, keys.job_events(M, "j"))]
    assert got == [_tok(0, [5], "a"), _tok(1, [6], "b"), _final([5, 6], "ab")]
    assert await r.hget(keys.job_key(M, "j"), jobs.STATUS) == b"finished"
    sent = [codec.from_entry(f) for _, f in await _range(r, keys.TELEMETRY_STREAM)]
    assert [(t.step, t.decision_version) for t in sent] == [(1, 3), (2, 3)]  # type: ignore[attr-defined]


async def test_a_lost_lease_is_reported_and_nothing_is_written(r: aioredis.Redis) -> None:
    landed: list[Written] = []
    outbox, _, lease, entry = await _outbox(r, landed)
    await Leases(r, "w2", 60, model=M).start("j")  # another worker took the job over
    writes = [JobWrite("j", lease, entry, [_tok(0, [5], "a")])]
    assert await outbox._write(writes, []) == [False]
    assert await r.xlen(keys.job_events(M, "j")) == 0


async def test_steps_with_nothing_for_a_client_send_their_telemetry_in_one_write(r: aioredis.Redis) -> None:
    landed: list[Written] = []
    outbox, _, lease, entry = await _outbox(r, landed)
    outbox.telemetry_s = 0.2
    pipelines = 0
    real = outbox._write

    async def counted(writes: list[JobWrite], stats: list[StepStats]) -> list[bool]:
        nonlocal pipelines
        pipelines += bool(writes or stats)
        return await real(writes, stats)

    outbox._write = counted  # type: ignore[method-assign]
    async with anyio.create_task_group() as tg:
        tg.start_soon(outbox.run)
        for step in range(1, 6):  # five steps of held tokens: their stats wait
            await outbox.put(StepOutput([], StepStats(step=step, batch_size=1)))
            await outbox.flush()
        assert pipelines == 0 and await r.xlen(keys.TELEMETRY_STREAM) == 0
        # A job write takes the waiting stats with it, in the same round trip.
        final = JobWrite("j", lease, entry, [_tok(0, [5], "a")], _final([5], "a"))
        await outbox.put(StepOutput([final], StepStats(step=6, batch_size=1)))
        await outbox.flush()
        assert pipelines == 1
        sent = [codec.from_entry(f) for _, f in await _range(r, keys.TELEMETRY_STREAM)]
        assert [t.step for t in sent] == [1, 2, 3, 4, 5, 6]  # type: ignore[attr-defined]
        # With no job write to ride on, stats go once telemetry_s passed after the oldest.
        await outbox.put(StepOutput([], StepStats(step=7, batch_size=1)))
        with anyio.fail_after(5):
            while await r.xlen(keys.TELEMETRY_STREAM) < 7:
                await anyio.sleep(0.01)
        assert pipelines == 2
        tg.cancel_scope.cancel()
    assert [w.write.job_id for w in landed] == ["j"]


async def test_stats_that_join_waiting_ones_do_not_wake_the_writer_and_keep_their_order(
    r: aioredis.Redis,
) -> None:
    landed: list[Written] = []
    outbox, _, lease, entry = await _outbox(r, landed)
    outbox.telemetry_s = 0.2
    takes = 0
    real = outbox._take

    async def counted() -> list[StepOutput]:
        nonlocal takes
        got = await real()
        takes += bool(got)
        return got

    outbox._take = counted  # type: ignore[method-assign]
    async with anyio.create_task_group() as tg:
        tg.start_soon(outbox.run)
        await outbox.put(StepOutput([], StepStats(step=1, batch_size=1)))  # the writer starts its timer
        await outbox.flush()
        assert takes == 1
        for step in range(2, 6):  # they join step 1's stats: no turn of the writer
            await outbox.put(StepOutput([], StepStats(step=step, batch_size=1)))
            assert not outbox.unsent
        await outbox.flush()
        assert takes == 1
        # A job write still goes through the writer, and takes every waiting step with it.
        final = JobWrite("j", lease, entry, [_tok(0, [5], "a")], _final([5], "a"))
        await outbox.put(StepOutput([final], StepStats(step=6, batch_size=1)))
        await outbox.flush()
        assert takes == 2
        sent = [codec.from_entry(f) for _, f in await _range(r, keys.TELEMETRY_STREAM)]
        assert [t.step for t in sent] == [1, 2, 3, 4, 5, 6]  # type: ignore[attr-defined]
        # Alone again, stats go after telemetry_s (the writer's timer), joined ones with them.
        await outbox.put(StepOutput([], StepStats(step=7, batch_size=1)))
        await outbox.flush()
        await outbox.put(StepOutput([], StepStats(step=8, batch_size=1)))
        with anyio.fail_after(5):
            while await r.xlen(keys.TELEMETRY_STREAM) < 8:
                await anyio.sleep(0.01)
        assert takes == 3
        tg.cancel_scope.cancel()
    sent = [codec.from_entry(f) for _, f in await _range(r, keys.TELEMETRY_STREAM)]
    assert [t.step for t in sent] == list(range(1, 9))  # type: ignore[attr-defined]


REAL_REDIS_URL = "redis://127.0.0.1:6379/10"  # a db of this test's own, flushed around it


@pytest.fixture
async def real_r() -> AsyncIterator[aioredis.Redis]:
    async with flushed_redis(REAL_REDIS_URL) as client:
        yield client


def _landed_while_blocked(peek: redis.Redis, stream: str, n: int, within_s: float) -> bool:
    """Whether ``stream`` reaches ``n`` entries within ``within_s``, read by a client of its own
    while this thread (and so the event loop) is blocked, as a step on the loop blocks it."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if peek.xlen(stream) >= n:
            return True
        time.sleep(0.002)
    return False


@pytest.mark.redis
@pytest.mark.parametrize("turns", [8, 1])
async def test_let_send_hands_the_queued_writes_to_redis_before_the_loop_blocks(
    real_r: aioredis.Redis, turns: int
) -> None:
    """The engine steps on the event loop right after ``let_send``: what was put before
    must have gone to Redis by then, though the writer was still waiting for the reply to the
    last step's write (it came during the step). With a single turn of the loop (how it was)
    the writer reads that reply and the new write waits for the end of the next step."""
    landed: list[Written] = []
    outbox, _, lease, entry = await _outbox(real_r, landed)
    outbox.telemetry_s = 10.0  # stats alone would wait: only the job writes matter here
    stream = keys.job_events(M, "j")
    went: list[bool] = []
    with redis.Redis.from_url(REAL_REDIS_URL) as peek:
        async with anyio.create_task_group() as tg:
            tg.start_soon(outbox.run)
            first = JobWrite("j", lease, entry, [_tok(0, [5], "x")])
            await outbox.put(StepOutput([first]))  # connection made, script loaded
            await outbox.flush()
            for step in range(1, 4):
                write = JobWrite("j", lease, entry, [_tok(step, [5 + step], "x")])
                await outbox.put(StepOutput([write], StepStats(step=step, batch_size=1)))
                await outbox.let_send(turns)
                # no await: blocked. A write that went lands at once; the long window for it
                # only spares a loaded machine (CI) a false alarm, and costs nothing otherwise.
                went.append(_landed_while_blocked(peek, stream, step + 1, 2.0 if turns > 1 else 0.5))
            await outbox.flush()
            tg.cancel_scope.cancel()
    assert went[1:] == ([True] * 2 if turns == 8 else [False] * 2), went
    assert len(landed) >= 2 and all(w.held for w in landed)
