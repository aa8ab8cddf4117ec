"""Decisions are published one at a time: concurrent publishes (the periodic one and an
admin's command) get increasing versions and the latest is the later one."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
import redis.asyncio as aioredis

from planner.policies.base import Choice
from planner.publisher import DecisionPublisher
from shared import codec, keys
from shared.control import Decision

pytestmark = pytest.mark.anyio


class _SlowFirstSet:
    """``r`` whose first SET waits (up to 1 s) for a second one to start: a publish that is
    not serialised is overtaken by the next one there."""

    def __init__(self, r: aioredis.Redis) -> None:
        self._r = r
        self._sets = 0
        self._second = anyio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._r, name)

    async def set(self, *args: Any, **kwargs: Any) -> Any:
        self._sets += 1
        if self._sets == 1:
            with anyio.move_on_after(1.0):
                await self._second.wait()
        else:
            self._second.set()
        return await self._r.set(*args, **kwargs)


async def test_concurrent_publishes_are_serialised(r: aioredis.Redis) -> None:
    pub = DecisionPublisher(_SlowFirstSet(r), valid_for_s=60.0)  # type: ignore[arg-type]
    got: list[Decision] = []

    async def publish(note: str) -> None:
        got.append(await pub.publish(Choice(gamma_table=[(64, 1)]), "static", note))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(publish, "periodic")
            tg.start_soon(publish, "admin")
    assert [d.version for d in got] == [1, 2]
    raw = await r.get(keys.DECISION_LATEST)
    assert isinstance(raw, bytes)
    latest = codec.decode_as(raw, Decision)
    assert latest.version == 2 and latest.note == "admin"
    stream = await r.xrange(keys.DECISIONS_STREAM) or []
    versions = [codec.from_entry_as(dict(f or {}), Decision).version for _, f in stream]
    assert versions == [1, 2]
    assert pub.last is not None and pub.last.version == 2
