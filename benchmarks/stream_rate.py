"""How many jobs a second one model's job stream takes on one Redis (docs/scaling.md).

Measures, on a real Redis (a database of its own, flushed before and after):
- ``admit``: the gateway's admission script (queue check + job hash + XADD), by
  ``--producers`` concurrent clients, one job per call, as the gateway sends them;
- ``xadd``: plain XADDs (the stream alone, no script), same concurrency;
- ``consume``: ``--consumers`` workers taking entries with XREADGROUP COUNT 16 and
  answering each with XACK + XDEL, as workers do.

    .venv/bin/python -m benchmarks.stream_rate --url redis://127.0.0.1:6379/7 --jobs 20000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import redis.asyncio as aioredis

from gateway.admission import Admission
from shared import keys
from shared.connection import connect
from shared.schemas import JobRequest, SamplingParams
from shared.streams import ensure_group, entries

MODEL = "bench-model"


async def _spread(n: int, workers: int, one: object) -> float:
    """Seconds to run ``one(i)`` for i < n over ``workers`` concurrent tasks."""
    counter = iter(range(n))

    async def task() -> None:
        for i in counter:
            await one(i)  # type: ignore[operator]

    t0 = time.perf_counter()
    await asyncio.gather(*(task() for _ in range(workers)))
    return time.perf_counter() - t0


async def admit(r: aioredis.Redis, n: int, producers: int) -> float:
    adm = Admission(r)
    params = SamplingParams(max_tokens=64, temperature=0.7, seed=1)

    async def one(i: int) -> None:
        job = JobRequest(job_id=f"b{i}", model=MODEL, prompt="Once upon a time " * 8, params=params)
        got = await adm.submit(job, max_queue=10**9, ttl_s=600, owner="", fingerprint="f")
        assert got.outcome == "ok"

    return await _spread(n, producers, one)


async def xadd(r: aioredis.Redis, n: int, producers: int) -> float:
    stream = keys.jobs_stream(MODEL + "-raw")
    payload = {b"m": b"x" * 200}

    async def one(i: int) -> None:
        await r.xadd(stream, payload)  # type: ignore[arg-type]

    return await _spread(n, producers, one)


async def consume(r: aioredis.Redis, n: int, consumers: int) -> float:
    stream = keys.jobs_stream(MODEL)
    await ensure_group(r, stream, keys.JOBS_GROUP)
    left = n

    async def worker(name: str) -> None:
        nonlocal left
        while left > 0:
            resp = await r.xreadgroup(keys.JOBS_GROUP, name, {stream: ">"}, count=16, block=100)
            for entry_id, _ in entries(resp):
                async with r.pipeline(transaction=True) as pipe:
                    pipe.xack(stream, keys.JOBS_GROUP, entry_id)
                    pipe.xdel(stream, entry_id)
                    await pipe.execute()
                left -= 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(f"w{i}") for i in range(consumers)))
    return time.perf_counter() - t0


async def main(url: str, jobs: int, producers: int, consumers: int) -> dict[str, float]:
    r = connect(url)
    await r.flushdb()
    try:
        out = {
            "admit_per_s": jobs / await admit(r, jobs, producers),
            "xadd_per_s": jobs / await xadd(r, jobs, producers),
            "consume_per_s": jobs / await consume(r, jobs, consumers),
        }
    finally:
        await r.flushdb()
        await r.aclose()
    return {k: round(v) for k, v in out.items()}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="redis://127.0.0.1:6379/7")
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--producers", type=int, default=32)
    ap.add_argument("--consumers", type=int, default=8)
    a = ap.parse_args()
    if not a.url.startswith(("redis://", "unix://")) or a.url.rstrip("/").endswith("/0"):
        raise SystemExit("use a real Redis database of its own (flushed), e.g. redis://127.0.0.1:6379/7")
    print(json.dumps(asyncio.run(main(a.url, a.jobs, a.producers, a.consumers))))
