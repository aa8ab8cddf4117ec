"""What one completion costs Redis: commands and Redis CPU per request, by command.

Starts the three services on a real Redis (γ = 0, no drafters; the worker on its own core),
sends ``--requests`` completions one at a time (concurrency 1, greedy, EOS ignored) and
reads Redis's ``INFO commandstats`` before and after: calls and microseconds of Redis CPU
per request, by command. The same stretch of idle time is measured after, so the background
(heartbeats, renewals, the planner's reads) can be told apart. The Redis server is shared by
every database on it: run it on a Redis nothing else uses.

    python -m benchmarks.redis_cost --redis-url redis://127.0.0.1:6379/9 [--stream]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import redis.asyncio as aioredis

from benchmarks.serve_overhead import PROMPTS, plain_trio


def _delta(after: dict[str, Any], before: dict[str, Any], field: str) -> dict[str, int]:
    return {k: v[field] - before.get(k, {field: 0})[field] for k, v in after.items()}


async def _stats(r: aioredis.Redis) -> dict[str, Any]:
    return dict(await r.info("commandstats"))


async def measure(args: argparse.Namespace) -> None:
    cores = sorted(os.sched_getaffinity(0))
    async with plain_trio(args, str(cores[-1]), "redis-cost") as trio:
        r = aioredis.Redis.from_url(args.redis_url)
        async with httpx.AsyncClient(base_url=trio.base_url, timeout=120) as client:

            async def one(i: int) -> None:
                body = {
                    "prompt": PROMPTS[i % len(PROMPTS)],
                    "max_tokens": args.tokens,
                    "temperature": 0,
                    "ignore_eos": True,
                    "stream": args.stream,
                }
                (await client.post("/v1/completions", json=body)).raise_for_status()

            for i in range(3):  # warm
                await one(i)
            before = await _stats(r)
            t0 = time.perf_counter()
            for i in range(args.requests):
                await one(i)
            wall = time.perf_counter() - t0
            after = await _stats(r)
        await anyio.sleep(0.5)
        idle_before = await _stats(r)
        await anyio.sleep(wall)  # the services idle for as long as the requests took
        idle_after = await _stats(r)
        await r.aclose()
    n = args.requests
    calls, usec = _delta(after, before, "calls"), _delta(after, before, "usec")
    idle = _delta(idle_after, idle_before, "calls")
    kind = "streamed" if args.stream else "non-streaming"
    print(
        f"{n} {kind} completions of {args.tokens} tokens at concurrency 1 ({wall / n * 1000:.0f} ms each): "
        f"{sum(calls.values()) / n:.1f} Redis commands and {sum(usec.values()) / n:.0f} µs of Redis CPU "
        f"per request (idle background over the same time: {sum(idle.values()) / n:.1f} commands)"
    )
    print("| command | calls per request | µs per request | idle calls per request-time |")
    print("|---|---|---|---|")
    for name in sorted(calls, key=lambda k: -calls[k]):
        if calls[name]:
            short = name.removeprefix("cmdstat_")
            print(f"| {short} | {calls[name] / n:.1f} | {usec[name] / n:.0f} | {idle.get(name, 0) / n:.1f} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="models/nj-target")
    p.add_argument("--redis-url", required=True)
    p.add_argument("--requests", type=int, default=20)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--stream", action="store_true", help="streamed completions (every step's tokens written)")
    p.add_argument("--log-dir", default="/tmp/nightjar-redis-cost")
    args = p.parse_args(argv)
    args.concurrency = 1
    Path(args.log_dir).mkdir(parents=True, exist_ok=True)
    anyio.run(measure, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
