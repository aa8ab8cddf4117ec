"""The event hub: one blocked read covers every followed stream of a model."""

from __future__ import annotations

import anyio
import pytest
import redis.asyncio as aioredis

from gateway.hub import EventHub
from shared import keys

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
