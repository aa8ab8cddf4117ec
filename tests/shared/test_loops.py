from __future__ import annotations

import anyio
import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from shared.loops import Signal, keep_running

pytestmark = pytest.mark.anyio


async def test_keep_running_survives_redis_errors() -> None:
    calls = 0
    done = anyio.Event()

    async def flaky() -> None:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise RedisConnectionError("down")
        done.set()
        await anyio.sleep_forever()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(keep_running, "flaky", flaky, 0.01)
            await done.wait()
            tg.cancel_scope.cancel()
    assert calls == 3


async def test_keep_running_lets_other_errors_through() -> None:
    async def broken() -> None:
        raise KeyError("bug")

    with pytest.raises(KeyError):
        await keep_running("broken", broken)


async def test_signal_wakes_every_waiter() -> None:
    sig = Signal()
    woke = 0

    async def waiter() -> None:
        nonlocal woke
        await sig.wait()
        woke += 1

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            sig.fire()
    assert woke == 3
