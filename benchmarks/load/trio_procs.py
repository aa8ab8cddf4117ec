"""A fresh gateway, planner and worker as three processes on a real Redis, per configuration.

The services run exactly as deployed — ``python -m nightjar gateway|planner|worker``, the
planner started with the configuration's policy — so the benchmark process holds only the
load client and the stream reader, and shares no interpreter (no GIL) with the engine.
Before each configuration every Nightjar key (``nj:*``) of the Redis database is deleted,
and nothing else: the database can be shared with other programs, not with another Nightjar.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import redis.asyncio as aioredis

from benchmarks.load.configs import BenchConfig
from benchmarks.load.trio import WORKER_ID, Trio, TrioOptions, free_port, wait_for_decision, wait_ready
from shared import keys
from shared.connection import connect

log = logging.getLogger(__name__)


async def clear_nightjar_keys(r: aioredis.Redis) -> int:
    """Delete every ``nj:`` key (jobs, streams, decisions, policy state); returns how many."""
    n = 0
    async for key in r.scan_iter(match=keys.PREFIX + "*", count=1000):
        n += int(await r.delete(key))
    return n


def service_commands(cfg: BenchConfig, opts: TrioOptions, redis_url: str, port: int) -> dict[str, list[str]]:
    """The ``nightjar`` command line of each service."""
    base = [sys.executable, "-m", "nightjar", "--log-level", "warning"]
    sets = [a for k, v in cfg.params.items() for a in ("--set", f"{k}={v}")]
    engine = [a for k, v in opts.engine.items() for a in ("--engine-opt", f"{k}={_text(v)}")]
    threads = ["--threads", str(opts.threads)] if opts.threads else []
    redis = ["--redis-url", redis_url]
    pin = ["taskset", "-c", opts.worker_cpus] if opts.worker_cpus else []
    apart = ["taskset", "-c", opts.other_cpus] if opts.other_cpus else []
    # A static configuration never reads the startup cost profile: its worker skips measuring it.
    profile = ["--no-profile"] if cfg.is_static else []
    return {
        "planner": [*apart, *base, "planner", *redis, "--policy", cfg.policy, *sets],
        "worker": [*pin, *base, "worker", *redis, "--model", opts.model_dir, "--worker-id", WORKER_ID,
                   "--max-jobs", str(opts.max_jobs), *profile, *threads, *engine],
        "gateway": [*apart, *base, "gateway", *redis, "--host", "127.0.0.1", "--port", str(port),
                    "--max-queue", str(opts.max_queue)],
    }  # fmt: skip


def _text(v: object) -> str:
    return v if isinstance(v, str) else json.dumps(v)


def _stop(procs: dict[str, subprocess.Popen[bytes]]) -> None:
    for p in procs.values():
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for name, p in procs.items():
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop on SIGTERM: killed", name)
            p.kill()
            p.wait()


def _check_alive(procs: dict[str, subprocess.Popen[bytes]]) -> None:
    dead = {n: p.returncode for n, p in procs.items() if p.poll() is not None}
    if dead:
        raise RuntimeError(f"service(s) exited at start, exit codes {dead} (see their logs)")


@asynccontextmanager
async def process_trio(
    cfg: BenchConfig, opts: TrioOptions, redis_url: str, log_dir: Path
) -> AsyncIterator[Trio]:
    """Start the three services with ``cfg``'s policy; stop them (SIGTERM) when the block ends."""
    if not redis_url.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError("separate service processes need a real Redis: --redis-url redis://HOST:PORT/DB")
    r = connect(redis_url)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    log_dir.mkdir(parents=True, exist_ok=True)
    try:
        await clear_nightjar_keys(r)
        port = free_port()
        commands = service_commands(cfg, opts, redis_url, port)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        deadline = time.monotonic() + opts.start_timeout_s

        def spawn(name: str) -> None:
            out = (log_dir / f"{cfg.name}-{name}.log").open("wb")
            procs[name] = subprocess.Popen(commands[name], stdout=out, stderr=subprocess.STDOUT, env=env)
            out.close()  # the child holds its own descriptor

        spawn("planner")
        await wait_for_decision(r, deadline, lambda: _check_alive(procs))
        spawn("worker")
        spawn("gateway")
        base_url = f"http://127.0.0.1:{port}"
        await wait_ready(base_url, r, deadline, lambda: _check_alive(procs))
        log.info("service processes up for %s at %s", cfg.name, base_url)
        yield Trio(base_url, r)
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(_stop, procs)
            await r.aclose()
