"""Processes of the chaos suite: a restartable Redis with AOF, and the Nightjar services.

Everything binds 127.0.0.1. The Redis is the suite's own (a free port, its data under a
temporary directory, ``appendfsync always``), so it can be killed and started again on the
same port and directory without touching anybody else's server. Every wait here is on a
condition with a deadline; nothing sleeps blindly.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis
import redis.asyncio as aioredis

from shared import codec, keys
from shared.control import WorkerInfo
from shared.streams import group_load
from tests.chaos import names
from tests.e2e.conftest import free_port, poll

START_TIMEOUT_S = 120.0  # 2 shared cores: four interpreters importing torch at once take a while


def _wait_sync(check: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


@dataclass
class RedisServer:
    """A redis-server of our own: AOF on, every write fsynced before it is acknowledged."""

    dir: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def _ping(self) -> bool:
        try:
            with redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=0.5) as c:
                return bool(c.ping())
        except (redis.RedisError, OSError):
            return False

    def start(self, timeout_s: float = 20.0) -> None:
        assert self.proc is None or self.proc.poll() is not None, "redis-server already running"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        log = (self.dir / f"redis-{self.starts}.log").open("wb")
        cmd = [
            "redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--dir", str(self.dir),
            "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--daemonize", "no",
        ]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        _wait_sync(self._ping, timeout_s, f"redis-server on port {self.port}")

    def stop(self, sig: int = signal.SIGKILL) -> float:
        """Kill the server (SIGKILL by default: no shutdown save, only the AOF survives);
        return when it went."""
        assert self.proc is not None
        self.proc.send_signal(sig)
        self.proc.wait(timeout=10)
        return time.time()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class Cluster:
    """The gateway, the planner and two workers as ``python -m nightjar`` processes, on the
    suite's own ``redis`` (or, when ``redis_url`` is given, on that URL: a Redis Cluster or
    Sentinel set that tests/cluster runs, which ``heal`` leaves alone)."""

    redis: RedisServer | None
    model_dir: Path
    logs: Path
    workers: tuple[str, ...] = ("wA", "wB")
    claim_idle_s: float = 3.0  # the only failover setting: renewals every 1 s, sweeps every 0.5 s
    max_jobs: int = 8
    drain_timeout_s: float = 5.0
    outage_grace_s: float = 15.0  # the gateway's: a 5 s Redis outage is ridden out, a 30 s one is not
    admin_token: str = "chaos-admin-token"
    port: int = field(default_factory=free_port)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    starts: dict[str, int] = field(default_factory=dict)
    redis_url: str = ""
    worker_args: tuple[str, ...] = ()  # more options of every worker (e.g. --no-profile)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def names(self) -> tuple[str, ...]:
        return ("gateway", "planner", *self.workers)

    def command(self, name: str) -> list[str]:
        base = [sys.executable, "-m", "nightjar", "--log-level", "info"]
        assert self.redis_url or self.redis is not None, "a Redis to run on"
        rurl = ["--redis-url", self.redis_url or (self.redis.url() if self.redis else "")]
        if name == "gateway":
            return [*base, "gateway", *rurl, "--host", "127.0.0.1", "--port", str(self.port),
                    "--max-queue", "500", "--outage-grace", str(self.outage_grace_s)]  # fmt: skip
        if name == "planner":
            return [*base, "planner", *rurl, "--policy", "static", "--set", "gamma=1"]
        return [*base, "worker", *rurl, "--model", str(self.model_dir), "--worker-id", name,
                "--max-jobs", str(self.max_jobs), "--engine-opt", "num_blocks=256",
                "--claim-idle", str(self.claim_idle_s), "--threads", "1", *self.worker_args]  # fmt: skip

    def start(self, name: str) -> None:
        old = self.procs.get(name)
        assert old is None or old.poll() is not None, f"{name} is running"
        self.starts[name] = self.starts.get(name, 0) + 1
        env = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
            "NIGHTJAR_ADMIN_TOKEN": self.admin_token,
            "NIGHTJAR_DRAIN_TIMEOUT_S": str(self.drain_timeout_s),
        }
        log = (self.logs / f"{name}.log").open("ab")
        log.write(f"\n===== start {self.starts[name]} of {name} at {time.time():.3f}\n".encode())
        log.flush()
        self.procs[name] = subprocess.Popen(self.command(name), stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()

    def start_all(self) -> None:
        for name in self.names:
            self.start(name)

    def signal(self, name: str, sig: int) -> float:
        """Send ``sig`` to one service; a SIGKILL also waits for the exit. Returns the time sent."""
        t = time.time()
        self.procs[name].send_signal(sig)
        if sig == signal.SIGKILL:
            self.procs[name].wait(timeout=10)
        return t

    def dead(self) -> dict[str, int]:
        """Services that exited, with their exit codes."""
        return {n: rc for n, p in self.procs.items() if (rc := p.poll()) is not None}

    def log_tail(self, name: str, chars: int = 4000) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def log_size(self, name: str) -> int:
        path = self.logs / f"{name}.log"
        return path.stat().st_size if path.exists() else 0

    def log_since(self, name: str, offset: int) -> str:
        with (self.logs / f"{name}.log").open("rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")

    def logs_of_dead(self) -> str:
        return "\n".join(f"--- {n} exited {rc}:\n{self.log_tail(n)}" for n, rc in self.dead().items())

    def stop_all(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGCONT)  # a paused process cannot act on SIGTERM
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(timeout=self.drain_timeout_s + 15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    async def live_workers(self, r: aioredis.Redis) -> set[str]:
        """Workers whose current process registered within the last 3 s."""
        now = time.time()
        live = set()
        for raw in (await r.hgetall(keys.WORKERS)).values():
            info = codec.decode_as(raw, WorkerInfo) if isinstance(raw, bytes) else None
            if info is None:
                continue
            p = self.procs.get(info.worker_id)
            if p is not None and p.poll() is None and info.pid == p.pid and now - info.ts < 3:
                live.add(info.worker_id)
        return live

    async def wait_ready(self, r: aioredis.Redis, timeout_s: float = START_TIMEOUT_S) -> None:
        """Every service running, every worker registered by its current process, the
        gateway answering, a planner decision published."""
        async with httpx.AsyncClient(base_url=self.url, timeout=5) as client:

            async def ready() -> bool:
                if self.dead():
                    raise AssertionError("a service exited while starting:\n" + self.logs_of_dead())
                try:
                    if (await client.get("/health")).status_code != 200:
                        return False
                except httpx.TransportError:
                    return False
                return await self.live_workers(r) == set(self.workers) and bool(
                    await r.exists(keys.DECISION_LATEST)
                )

            await poll(ready, timeout_s, "the chaos cluster to be ready", every_s=0.2)

    async def heal(self, r: aioredis.Redis) -> None:
        """Resume paused services, restart exited ones, wait until all are ready again."""
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
        if self.redis is not None and not self.redis.alive():
            self.redis.start()
        for name in self.dead():
            self.start(name)
        await self.wait_ready(r)
        await self.wait_quiet(r)

    async def wait_quiet(self, r: aioredis.Redis, timeout_s: float = 90.0) -> None:
        """Wait until no job is queued or running (what an earlier test left behind), so
        each scenario's numbers are its own. Past the deadline, go on with a warning."""

        async def quiet() -> bool:
            pending, lag = await group_load(r, names.jobs_stream(), names.JOBS_GROUP)
            return pending + lag == 0

        try:
            await poll(quiet, timeout_s, "an idle job stream", every_s=0.2)
        except AssertionError:
            print(f"warning: jobs still queued or running after {timeout_s}s; the scenario starts anyway")


async def wait_for(check: object, timeout_s: float, what: str, every_s: float = 0.05) -> object:
    """``poll`` under another name, so tests read as what they wait for."""
    return await poll(check, timeout_s, what, every_s)  # type: ignore[arg-type]
