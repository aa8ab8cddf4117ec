"""``nightjar top``: a live terminal view of a running deployment, from Redis alone.

It reads what the services already keep in Redis — the worker registry (``nj:workers``), the
tail of the telemetry stream, the latest decision and the acks, the planner's running
policy and status (drafter weights), the job group's pending and lag — and redraws every
``--interval`` seconds; ``--once`` prints one snapshot and exits. Nothing here talks to a
service, so it works the same against ``nightjar up``'s embedded store (which ``up`` serves
on 127.0.0.1 and announces: top finds it when told no Redis, ``nightjar/store_server.py``)
and against any Redis a deployment uses. What it reads and how it renders it:
``shared/overview.py`` (the gateway's chat page shows the same).
"""

from __future__ import annotations

import argparse
import sys

import anyio
import redis.asyncio as aioredis
from pydantic import Field

from nightjar.flags import add, build, given
from nightjar.options import STANDALONE_REDIS, UsageError
from shared.overview import Snapshot, WorkerView, render, snapshot
from shared.settings import EnvSettings

__all__ = ["CLEAR", "Snapshot", "WorkerView", "build_parser", "main", "render", "show", "snapshot"]

CLEAR = "\x1b[H\x1b[2J"


async def show(r: aioredis.Redis, url: str, once: bool, interval: float, tail: int) -> None:
    while True:
        text = render(await snapshot(r, tail), url)
        if once:
            print(text, flush=True)
            return
        sys.stdout.write(CLEAR + text + "\n")
        sys.stdout.flush()
        await anyio.sleep(interval)


class TopSettings(EnvSettings):
    redis_url: str | None = Field(
        default=None,
        description="the deployment's Redis; unset: the embedded store of a running `nightjar up` on this "
        f"machine (it announces itself), else {STANDALONE_REDIS}",
    )
    once: bool = Field(
        default=False, validation_alias="NIGHTJAR_TOP_ONCE", description="print one snapshot and exit"
    )
    interval: float = Field(
        default=1.0, gt=0, validation_alias="NIGHTJAR_TOP_INTERVAL", description="seconds between refreshes"
    )
    tail: int = Field(
        default=500,
        ge=1,
        validation_alias="NIGHTJAR_TOP_TAIL",
        description="telemetry entries the rates are taken over",
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nightjar top", description=__doc__.split("\n\n")[0])
    add(p, "--redis-url", TopSettings, "redis_url")
    add(p, "--once", TopSettings, "once", action="store_const", const=True)
    add(p, "--interval", TopSettings, "interval", type=float)
    add(p, "--tail", TopSettings, "tail", type=int)
    return p


def store_url(given: str | None) -> tuple[str, str]:
    """The Redis to watch and where it came from: ``--redis-url`` / NIGHTJAR_REDIS_URL, else
    the newest running ``nightjar up`` (``nightjar.store_server``), else the local default."""
    if given:
        return given, "given"
    from nightjar.store_server import announced

    ups = announced()
    if ups:
        return ups[0].redis_url, f"nightjar up, pid {ups[0].pid}"
    return STANDALONE_REDIS, "default"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = build(TopSettings, **given(args, TopSettings))
    except UsageError as exc:
        print(f"nightjar top: error: {exc}", file=sys.stderr)
        return 2
    url, source = store_url(settings.redis_url)
    if url.startswith("memory://"):
        print(
            "nightjar top: error: memory:// lives inside the `nightjar up` process; leave --redis-url out "
            "to find a running `nightjar up`, or give the Redis URL the services use",
            file=sys.stderr,
        )
        return 2
    from redis.exceptions import RedisError

    from shared.connection import connect

    async def go() -> None:
        r = connect(url)
        try:
            await show(r, url, settings.once, settings.interval, settings.tail)
        finally:
            await r.aclose()

    try:
        anyio.run(go)
    except KeyboardInterrupt:
        return 0
    except (RedisError, OSError) as exc:
        print(f"nightjar top: error: Redis at {url} ({source}): {exc}", file=sys.stderr)
        return 1
    return 0
