"""Service-loop plumbing: loops that outlive a Redis hiccup, and a wake-up signal."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

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


T = TypeVar("T")


async def retry_redis(
    what: str,
    attempt: Callable[[], Awaitable[T]],
    *,
    backoff_s: float = 0.1,
    max_backoff_s: float = 2.0,
    on_error: Callable[[BaseException], None] | None = None,
) -> T:
    """Await ``attempt()`` until it gets through a Redis or network error: the pause doubles
    up to ``max_backoff_s``, and a warning is logged at most every 5 s. For what must happen
    (a write in hand, a start) rather than a loop that may simply go round again."""
    last_log = -math.inf
    while True:
        try:
            return await attempt()
        except (RedisError, OSError) as exc:
            if on_error is not None:
                on_error(exc)
            if time.monotonic() - last_log >= 5.0:
                log.warning("%s: %s: %s (retrying until Redis answers)", what, type(exc).__name__, exc)
                last_log = time.monotonic()
            await anyio.sleep(backoff_s)
            backoff_s = min(max_backoff_s, backoff_s * 2)


async def wait_for_redis(r: Any, service: str, max_backoff_s: float = 5.0) -> None:
    """Return once Redis answers a PING, so a service started before its Redis waits for it
    instead of exiting."""
    await retry_redis(f"{service}: waiting for Redis", r.ping, max_backoff_s=max_backoff_s)
