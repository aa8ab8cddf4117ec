"""``nightjar top``: a live terminal view of a running deployment, from Redis alone.

It reads what the services already keep in Redis — the worker registry (``nj:workers``), the
tail of the telemetry stream, the latest decision and the acks, the planner's running
policy and status (drafter weights), the job group's pending and lag — and redraws every
``--interval`` seconds; ``--once`` prints one snapshot and exits. Nothing here talks to a
service, so it works the same against ``nightjar up``'s embedded store (in its process) and
against any Redis a deployment uses. What it reads and how it renders it:
``shared/overview.py`` (the gateway's chat page shows the same).
"""

from __future__ import annotations

import argparse
import os
import sys

import anyio
import redis.asyncio as aioredis

from shared.overview import Snapshot, WorkerView, render, snapshot

__all__ = ["CLEAR", "Snapshot", "WorkerView", "main", "render", "show", "snapshot"]

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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nightjar top", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--redis-url",
        default=os.environ.get("NIGHTJAR_REDIS_URL", "redis://127.0.0.1:6379/0"),
        help="NIGHTJAR_REDIS_URL",
    )
    p.add_argument("--once", action="store_true", help="print one snapshot and exit")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    p.add_argument("--tail", type=int, default=500, help="telemetry entries the rates are taken over")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.interval <= 0 or args.tail < 1:
        print("nightjar top: error: --interval must be positive and --tail at least 1", file=sys.stderr)
        return 2
    if args.redis_url.startswith("memory://"):
        print(
            "nightjar top: error: memory:// lives inside the `nightjar up` process; run the services "
            "on a Redis (--redis-url redis://...) to watch them from another process",
            file=sys.stderr,
        )
        return 2
    from redis.exceptions import RedisError

    from shared.connection import connect

    async def go() -> None:
        r = connect(args.redis_url)
        try:
            await show(r, args.redis_url, args.once, args.interval, args.tail)
        finally:
            await r.aclose()

    try:
        anyio.run(go)
    except KeyboardInterrupt:
        return 0
    except (RedisError, OSError) as exc:
        print(f"nightjar top: error: Redis at {args.redis_url}: {exc}", file=sys.stderr)
        return 1
    return 0
