from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from shared.streams import ensure_group, entries, group_load, id_str, last_id

pytestmark = pytest.mark.anyio


async def test_group_load_counts_pending_and_lag(r: aioredis.Redis) -> None:
    assert await group_load(r, "s", "g") == (0, 0)  # no stream yet
    await ensure_group(r, "s", "g")
    await ensure_group(r, "s", "g")  # idempotent
    for i in range(5):
        await r.xadd("s", {b"i": i})
    assert await group_load(r, "s", "g") == (0, 5)  # a group made at "0" sees older entries
    got = entries(await r.xreadgroup("g", "c", {"s": ">"}, count=2))
    assert await group_load(r, "s", "g") == (2, 3)
    await r.xack("s", "g", got[0][0])
    assert await group_load(r, "s", "g") == (1, 3)
    assert await group_load(r, "s", "other") == (0, 0)


async def test_last_id_is_a_cursor_that_misses_nothing(r: aioredis.Redis) -> None:
    assert await last_id(r, "s") == "0-0"
    first = id_str(await r.xadd("s", {b"a": 1}))
    assert await last_id(r, "s") == first
    second = id_str(await r.xadd("s", {b"a": 2}))
    assert [id_str(e) for e, _ in entries(await r.xread({"s": first}))] == [second]


def test_entries_accepts_resp2_resp3_and_skips_deleted() -> None:
    resp2 = [[b"s", [(b"1-0", {b"a": b"1"}), (b"2-0", None)]]]
    resp3 = {b"s": [[(b"1-0", {b"a": b"1"})]][0]}
    assert entries(resp2) == [(b"1-0", {b"a": b"1"})]
    assert entries(resp3) == [(b"1-0", {b"a": b"1"})]
    assert entries(None) == [] and entries([]) == []
