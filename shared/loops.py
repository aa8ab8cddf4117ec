"""Service-loop plumbing: loops that outlive a Redis hiccup, and a wake-up signal."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

import anyio
from redis.exceptions import RedisError

log = logging.getLogger(__name__)


async def keep_running(
    name: str, iteration: Callable[[], Awaitable[object]], backoff_s: float = 1.0
) -> NoReturn:
    """Run ``iteration`` forever; a Redis or network error is logged and retried after a pause."""
    while True:
        try:
            await iteration()
        except (RedisError, OSError) as exc:
            log.warning("%s: %s: %s (retrying in %.1fs)", name, type(exc).__name__, exc, backoff_s)
            await anyio.sleep(backoff_s)


async def every(period_s: float, iteration: Callable[[], Awaitable[object]], name: str) -> NoReturn:
    """Run ``iteration`` every ``period_s`` seconds, surviving Redis errors."""

    async def tick() -> None:
        await anyio.sleep(period_s)
        await iteration()

    await keep_running(name, tick, backoff_s=period_s)


class Signal:
    """An edge-triggered wake-up: ``fire`` wakes every task waiting at that moment.

    Waiters re-check their condition in a loop; since nothing awaits between the check and
    ``wait()``, no wake-up is lost on a single event loop.
    """

    def __init__(self) -> None:
        self._event = anyio.Event()

    def fire(self) -> None:
        self._event.set()
        self._event = anyio.Event()

    async def wait(self) -> None:
        await self._event.wait()


async def wait_for_redis(r: Any, service: str, max_backoff_s: float = 5.0) -> None:
    """Return once Redis answers a PING; until then retry with backoff, logging a line every
    few seconds, so a service started before its Redis waits for it instead of exiting."""
    backoff, last_log = 0.1, -math.inf
    while True:
        try:
            await r.ping()
            return
        except (RedisError, OSError) as exc:
            if time.monotonic() - last_log >= 5.0:
                log.warning("%s: waiting for Redis (%s: %s)", service, type(exc).__name__, exc)
                last_log = time.monotonic()
            await anyio.sleep(backoff)
            backoff = min(max_backoff_s, backoff * 2)
