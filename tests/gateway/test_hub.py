"""The event hub: one blocked read covers every followed stream of a model."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
import redis.asyncio as aioredis

from gateway.hub import EventHub
from shared import codec, jobs, keys
from shared.schemas import FinishEvent, TokenEvent

pytestmark = pytest.mark.anyio


def count_xreads(r: aioredis.Redis) -> list[int]:
    """Wrap ``r.xread``; the returned one-item list counts the calls."""
    n, real = [0], r.xread

    async def counting(*args: object, **kwargs: object) -> object:
        n[0] += 1
        return await real(*args, **kwargs)  # type: ignore[arg-type]

    r.xread = counting  # type: ignore[method-assign]
    return n


M = "tiny"


async def test_many_followers_share_one_read_and_a_late_one_is_woken(r: aioredis.Redis) -> None:
    hub = EventHub(r)
    streams = [keys.job_events(M, f"j{i}") for i in range(5)]
    subs = [hub.subscribe(M, s) for s in streams]
    xreads = count_xreads(r)
    got: dict[int, list[bytes]] = {}

    async def follow(i: int) -> None:
        got[i] = [f[b"m"] for _, f in await subs[i].read("0-0", 5000)]

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            for i in range(4):
                tg.start_soon(follow, i)
            await anyio.sleep(0.05)  # the hub's read is blocked on the first four streams
            tg.start_soon(follow, 4)  # a late follower: the hub must start over with it
            await anyio.sleep(0.05)
            for i, s in enumerate(streams):
                await r.xadd(s, {b"m": b"%d" % i})
    assert got == {i: [b"%d" % i] for i in range(5)}
    assert xreads[0] < 10  # a handful of shared reads, not one blocked read per follower
    for s in subs:
        s.close()


async def test_a_reader_gets_only_what_follows_its_cursor_and_a_last_look_does_not_block(
    r: aioredis.Redis,
) -> None:
    hub = EventHub(r)
    stream = keys.job_events(M, "j")
    first = await r.xadd(stream, {b"m": b"a"})
    await r.xadd(stream, {b"m": b"b"})
    sub = hub.subscribe(M, stream)
    with anyio.fail_after(5):
        got = await sub.read(first.decode(), 5000)
        assert [f[b"m"] for _, f in got] == [b"b"]
        assert await sub.read(got[-1][0].decode(), None) == []
    sub.close()


async def test_a_burst_of_new_followers_wakes_the_blocked_read_once_not_once_each(r: aioredis.Redis) -> None:
    hub = EventHub(r)
    streams = [keys.job_events(M, f"b{i}") for i in range(11)]
    subs = [hub.subscribe(M, s) for s in streams]
    xreads = count_xreads(r)
    got: dict[int, list[bytes]] = {}

    async def follow(i: int) -> None:
        got[i] = [f[b"m"] for _, f in await subs[i].read("0-0", 5000)]

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(follow, 0)
            while xreads[0] < 1:  # until the hub's read is out, blocked on the first stream
                await anyio.sleep(0.01)
            for i in range(1, 11):  # ten requests at once
                tg.start_soon(follow, i)
            while len(hub._subs[M]) < 11:
                await anyio.sleep(0.01)
            for i, s in enumerate(streams):
                await r.xadd(s, {b"m": b"%d" % i})
    assert got == {i: [b"%d" % i] for i in range(11)}
    assert await r.xlen(keys.gateway_wake(M, hub.id)) < 5  # not one wake per new follower
    for s in subs:
        s.close()


async def test_a_cursor_past_the_largest_stream_id_does_not_fail_the_shared_read(r: aioredis.Redis) -> None:
    hub = EventHub(r)
    hostile = hub.subscribe(M, keys.job_events(M, "h"))
    plain = hub.subscribe(M, keys.job_events(M, "p"))
    got: list[bytes] = []

    async def follow() -> None:
        got.extend(f[b"m"] for _, f in await plain.read("0-0", 5000))

    with anyio.fail_after(5):
        assert await hostile.read("99999999999999999999-0", None) == []  # a Last-Event-ID past any
        async with anyio.create_task_group() as tg:
            tg.start_soon(follow)
            while len(hub._subs[M]) < 2:
                await anyio.sleep(0.01)
            await r.xadd(keys.job_events(M, "p"), {b"m": b"x"})
    assert got == [b"x"]
    hostile.close()
    plain.close()


def _final(job_id: str) -> FinishEvent:
    return FinishEvent(
        job_id=job_id, finish_reason="stop", text="t", token_ids=[1], prompt_tokens=1, completion_tokens=1
    )


async def _tokens(r: aioredis.Redis, job_id: str, n: int) -> None:
    for i in range(n):
        async with r.pipeline(transaction=False) as pipe:
            jobs.add_events(
                pipe, job_id, [TokenEvent(job_id=job_id, index=i, token_ids=[1], text="t")], model=M
            )
            await pipe.execute()


async def _finish(r: aioredis.Redis, job_id: str) -> None:
    async with r.pipeline(transaction=False) as pipe:
        jobs.add_result(pipe, _final(job_id), model=M)  # with its entry on the finished stream
        await pipe.execute()


async def _covering(hub: EventHub) -> None:
    with anyio.fail_after(5):
        while M not in hub._covering:  # the blocked read covers the finished stream
            await anyio.sleep(0.005)


async def test_final_only_readers_get_the_final_event_and_token_events_wake_nothing(
    r: aioredis.Redis,
) -> None:
    hub = EventHub(r)
    ids = [f"f{i}" for i in range(4)]
    subs = {j: hub.subscribe(M, keys.job_events(M, j), final_of=j) for j in ids}
    got: dict[str, list[Any]] = {}

    async def follow(j: str) -> None:
        got[j] = [codec.from_entry(f) for _, f in await subs[j].read("0-0", 5000)]

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(follow, ids[0])
            await _covering(hub)
            xreads, wakes = count_xreads(r), await r.xlen(keys.gateway_wake(M, hub.id))
            for j in ids[1:]:  # followers that come while the read covers the finished stream
                tg.start_soon(follow, j)
            for j in ids:
                await _tokens(r, j, 5)  # 20 token writes: the hub's read is not woken by them
            assert xreads[0] == 0
            for j in ids:
                await _finish(r, j)
    assert await r.xlen(keys.gateway_wake(M, hub.id)) == wakes  # no follower woke the read
    assert got == {j: [_final(j)] for j in ids}  # the final event alone, to each its own
    assert xreads[0] <= len(ids)  # a read per finish at most, none per token


async def test_a_final_only_reader_of_a_job_that_already_ended_gets_its_final(r: aioredis.Redis) -> None:
    hub = EventHub(r)
    await _tokens(r, "early", 2)
    await _finish(r, "early")
    other = hub.subscribe(M, keys.job_events(M, "other"), final_of="other")
    late = hub.subscribe(M, keys.job_events(M, "early"), final_of="early")
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(other.read, "0-0", 5000)  # the read covers the finished stream ...
            await _covering(hub)
            # ... from after the finish of "early": its reader finds it ended when it follows.
            got = await late.read("0-0", 5000)
            assert [codec.from_entry(f) for _, f in got] == [_final("early")]
            await _finish(r, "other")
    late.close()
    other.close()
