"""The control plane's ceiling: 1 Redis + 1 gateway + 1 planner driven by 8, 32, 128 workers.

For each worker count, on loopback: a fresh redis-server (AOF, fsync every second), the
gateway and the planner (static policy, γ = 0) as ``nightjar`` processes, and the workers as
``benchmarks.fake_workers`` processes — real worker services on the model-free synthetic
engine, whose steps take ``base + b · per_seq`` ms (slept, not computed). This process is the
client: ``--concurrency`` users each sending /v1/completions requests back to back (closed
loop; ``--stream`` for SSE streams, else whole answers), ``--tokens`` output tokens each.

Measured per window (``--idle`` seconds with no load, then ``--seconds`` under load after a
``--warmup``): requests and tokens done; CPU seconds of each process group (/proc); Redis's
own CPU and ``INFO commandstats`` calls; telemetry entries written, and observed by the
planner (its /metrics), with the planner group's lag at the end (did it keep up); decisions
published. From those: each component's requests and tokens per CPU-second (its ceiling on
one core, as each is one event loop — Redis one thread), Redis commands per token and per
request, and what idle workers cost. The machine's cores are shared by every process here
(and by whatever else runs): per-CPU-second figures hold, wall-clock rates are this box's.

    python -m benchmarks.control_plane --model models/nj-target --workers 8,32,128 --out cp.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import redis.asyncio as aioredis

from benchmarks.load.trio import free_port
from benchmarks.procstat import load_average, process_cpu_s
from shared import keys

GROUPS = ("gateway", "planner", "redis", "workers", "client")


@dataclass
class Deployment:
    size: int
    redis_port: int
    gateway_port: int
    planner_port: int
    procs: dict[str, list[subprocess.Popen[bytes]]] = field(default_factory=dict)

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    def pids(self, group: str) -> list[int]:
        if group == "client":
            return [os.getpid()]
        return [p.pid for p in self.procs.get(group, [])]


def _spawn(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    with log.open("ab") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)


@contextmanager
def deployed(args: argparse.Namespace, size: int, logs: Path) -> Iterator[Deployment]:
    d = Deployment(size, free_port(), free_port(), free_port())
    data = Path(tempfile.mkdtemp(prefix=f"cp-redis-{size}-"))
    nj = [sys.executable, "-m", "nightjar", "--log-level", "warning"]
    d.procs["redis"] = [
        _spawn(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(d.redis_port), "--dir", str(data),
             "--save", "", "--appendonly", "yes", "--appendfsync", "everysec", "--maxclients", "20000"],
            logs / f"redis-{size}.log",
        )
    ]  # fmt: skip
    d.procs["gateway"] = [
        _spawn(
            [*nj, "gateway", "--redis-url", d.redis_url, "--host", "127.0.0.1",
             "--port", str(d.gateway_port), "--max-queue", "1000000"],
            logs / f"gateway-{size}.log",
        )
    ]  # fmt: skip
    d.procs["planner"] = [
        _spawn(
            [*nj, "planner", "--redis-url", d.redis_url, "--policy", "static", "--set", "gamma=0",
             "--metrics-port", str(d.planner_port)],
            logs / f"planner-{size}.log",
        )
    ]  # fmt: skip
    hosts = max(1, min(args.hosts, size))
    d.procs["workers"] = []
    for h in range(hosts):
        count = size // hosts + (1 if h < size % hosts else 0)
        cmd = [sys.executable, "-m", "benchmarks.fake_workers", "--redis-url", d.redis_url,
               "--model", args.model, "--count", str(count), "--prefix", f"h{h}",
               "--base-ms", str(args.base_ms), "--per-seq-ms", str(args.per_seq_ms),
               "--max-jobs", str(args.max_jobs)]  # fmt: skip
        d.procs["workers"].append(_spawn(cmd, logs / f"workers-{size}-h{h}.log"))
    try:
        yield d
    finally:
        for group in ("workers", "gateway", "planner", "redis"):  # Redis last: the others drain on it
            procs = d.procs.get(group, [])
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


async def wait_ready(d: Deployment, r: aioredis.Redis, timeout_s: float) -> float:
    """Seconds until every worker registered, a decision is out and the gateway sees them."""
    t0 = time.monotonic()
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{d.gateway_port}", timeout=5) as gw:
        while time.monotonic() - t0 < timeout_s:
            for group, procs in d.procs.items():
                dead = [p.args for p in procs if p.poll() is not None]
                if dead:
                    raise RuntimeError(f"{group} exited while starting: {dead}")
            try:
                ok = await r.hlen(keys.WORKERS) >= d.size and await r.exists(keys.DECISION_LATEST)
                ok = ok and (await gw.get("/health")).json().get("workers") == d.size
            except (httpx.HTTPError, OSError, ValueError, aioredis.RedisError):
                ok = False
            if ok:
                return time.monotonic() - t0
            await anyio.sleep(0.5)
    raise RuntimeError(f"{d.size} workers not ready within {timeout_s}s")


@dataclass
class Snap:
    t: float
    cpu: dict[str, float]
    redis_cpu: float
    calls: dict[str, int]
    telemetry_added: int
    observed: float
    version: int
    requests: int
    tokens: int


@dataclass
class Load:
    requests: int = 0
    tokens: int = 0
    errors: dict[str, int] = field(default_factory=dict)  # what failed: "503", "ReadTimeout", ...

    def failed(self, what: str) -> None:
        self.errors[what] = self.errors.get(what, 0) + 1


async def snapshot(d: Deployment, r: aioredis.Redis, load: Load) -> Snap:
    cpu = {g: sum(process_cpu_s(p) for p in d.pids(g)) for g in GROUPS}
    info_cpu = await r.info("cpu")
    stats = await r.info("commandstats")
    calls = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}
    tele = await r.xinfo_stream(keys.TELEMETRY_STREAM)
    observed, version = 0.0, 0
    async with httpx.AsyncClient(timeout=5) as c:
        text = (await c.get(f"http://127.0.0.1:{d.planner_port}/metrics")).text
    for line in text.splitlines():
        if line.startswith("nightjar:planner_telemetry_observed_total"):
            observed += float(line.rsplit(" ", 1)[1])
        elif line.startswith("nightjar:planner_decision_version "):
            version = int(float(line.rsplit(" ", 1)[1]))
    return Snap(
        time.monotonic(), cpu, float(info_cpu["used_cpu_sys"]) + float(info_cpu["used_cpu_user"]),
        calls, int(tele["entries-added"]), observed, version, load.requests, load.tokens,
    )  # fmt: skip


def window(a: Snap, b: Snap, size: int) -> dict[str, Any]:
    wall = b.t - a.t
    req, tok = b.requests - a.requests, b.tokens - a.tokens
    cpu = {g: b.cpu[g] - a.cpu[g] for g in GROUPS}
    cpu["redis"] = b.redis_cpu - a.redis_cpu  # Redis's own count (finer than /proc's ticks)
    calls = {k: v - a.calls.get(k, 0) for k, v in b.calls.items() if v - a.calls.get(k, 0) > 0}
    total_calls = sum(calls.values()) - calls.get("info", 0) - calls.get("xinfo|stream", 0)
    tele = b.telemetry_added - a.telemetry_added
    out: dict[str, Any] = {
        "wall_s": round(wall, 2),
        "requests_per_s": round(req / wall, 1),
        "tokens_per_s": round(tok / wall, 1),
        "cpu_share": {g: round(cpu[g] / wall, 3) for g in cpu},  # cores busy
        "redis_calls_per_s": round(total_calls / wall, 1),
        "redis_calls_per_s_per_worker": round(total_calls / wall / size, 2),
        "telemetry_per_s": round(tele / wall, 1),
        "planner_observed_per_s": round((b.observed - a.observed) / wall, 1),
        "decisions_per_s": round((b.version - a.version) / wall, 2),
        "top_calls": dict(sorted(calls.items(), key=lambda kv: -kv[1])[:10]),
    }
    if tok:
        out["redis_calls_per_token"] = round(total_calls / tok, 3)
        out["redis_calls_per_request"] = round(total_calls / req, 1)
        out["tokens_per_cpu_s"] = {g: round(tok / cpu[g]) for g in cpu if cpu[g] > 0}
        out["requests_per_cpu_s"] = {g: round(req / cpu[g], 1) for g in cpu if cpu[g] > 0}
    if cpu["planner"] > 0 and tele:
        out["telemetry_per_planner_cpu_s"] = round(tele / cpu["planner"])
    return out


def marginal(idle: dict[str, Any], busy: dict[str, Any]) -> dict[str, Any]:
    """What the load added over the idle workers' background, per token and per request:
    Redis calls, and each component's CPU milliseconds (so its ceiling on one core)."""
    tok, req = busy["tokens_per_s"], busy["requests_per_s"]
    if not tok:
        return {}
    calls = busy["redis_calls_per_s"] - idle["redis_calls_per_s"]
    cpu = {g: busy["cpu_share"][g] - idle["cpu_share"][g] for g in busy["cpu_share"]}
    return {
        "redis_calls_per_token": round(calls / tok, 3),
        "redis_calls_per_request": round(calls / req, 1),
        "cpu_ms_per_1k_tokens": {g: round(c / tok * 1e6, 1) for g, c in cpu.items()},
        "cpu_ms_per_request": {g: round(c / req * 1e3, 2) for g, c in cpu.items()},
        "tokens_per_core_s": {g: round(tok / c) for g, c in cpu.items() if c > 0},
        "requests_per_core_s": {g: round(req / c, 1) for g, c in cpu.items() if c > 0},
    }


async def drive(url: str, args: argparse.Namespace, load: Load, stop: anyio.Event) -> None:
    n = args.concurrency + 8
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:

        async def user(i: int) -> None:
            n = 0
            while not stop.is_set():
                body: dict[str, Any] = {
                    "prompt": f"User {i} asks question {n}: tell me a story",
                    "max_tokens": args.tokens, "temperature": 0, "ignore_eos": True,
                }  # fmt: skip
                n += 1
                got, what = 0, ""
                try:
                    if args.stream:
                        body |= {"stream": True, "stream_options": {"include_usage": True}}
                        async with client.stream("POST", "/v1/completions", json=body) as resp:
                            what = str(resp.status_code)
                            async for line in resp.aiter_lines():
                                if line.startswith("data: {") and '"usage"' in line:
                                    usage = json.loads(line[6:]).get("usage") or {}
                                    got = usage.get("completion_tokens", got)
                    else:
                        resp = await client.post("/v1/completions", json=body)
                        what = str(resp.status_code)
                        got = resp.json()["usage"]["completion_tokens"] if resp.status_code == 200 else 0
                except (httpx.HTTPError, ValueError, KeyError) as exc:
                    what = type(exc).__name__
                if got:
                    load.requests += 1
                    load.tokens += got
                elif not stop.is_set():
                    load.failed(what)

        async with anyio.create_task_group() as tg:
            for i in range(args.concurrency):
                tg.start_soon(user, i)


async def measure_size(args: argparse.Namespace, size: int, logs: Path) -> dict[str, Any]:
    with deployed(args, size, logs) as d:
        r = aioredis.Redis.from_url(d.redis_url)
        try:
            ready_s = await wait_ready(d, r, args.start_timeout)
            load = Load()
            a = await snapshot(d, r, load)
            await anyio.sleep(args.idle)
            idle = window(a, await snapshot(d, r, load), size)
            stop = anyio.Event()
            async with anyio.create_task_group() as tg:
                tg.start_soon(drive, f"http://127.0.0.1:{d.gateway_port}", args, load, stop)
                await anyio.sleep(args.warmup)
                a = await snapshot(d, r, load)
                await anyio.sleep(args.seconds)
                b = await snapshot(d, r, load)
                groups = await r.xinfo_groups(keys.TELEMETRY_STREAM)
                stop.set()
            busy = window(a, b, size)
            planner = next((g for g in groups if g["name"] in (b"planner", "planner")), {})
            busy["planner_lag_at_end"] = int(planner.get("lag") or 0) + int(planner.get("pending") or 0)
            busy["client_errors"] = load.errors
            out = {"workers": size, "ready_s": round(ready_s, 1), "idle": idle, "load": busy}
            return out | {"marginal": marginal(idle, busy)}
        finally:
            await r.aclose()


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    logs = Path(args.log_dir)
    logs.mkdir(parents=True, exist_ok=True)
    results = []
    for size in (int(s) for s in args.workers.split(",")):
        print(f"--- {size} workers (load average {load_average()})", flush=True)
        got = await measure_size(args, size, logs)
        print(json.dumps(got), flush=True)
        results.append(got)
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.control_plane", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="models/nj-target", help="its tokenizer only")
    p.add_argument("--workers", default="8,32,128")
    p.add_argument("--hosts", type=int, default=4, help="fake-worker processes")
    p.add_argument("--concurrency", type=int, default=128, help="users sending requests back to back")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--stream", action="store_true")
    p.add_argument("--base-ms", type=float, default=20.0)
    p.add_argument("--per-seq-ms", type=float, default=0.15)
    p.add_argument("--max-jobs", type=int, default=64)
    p.add_argument("--idle", type=float, default=5.0)
    p.add_argument("--warmup", type=float, default=5.0)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--start-timeout", type=float, default=180.0)
    p.add_argument("--log-dir", default="/tmp/nightjar-control-plane")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    started = load_average()
    results = anyio.run(run, args)
    summary = {
        "machine": f"{os.cpu_count()} CPUs",
        "load_average": {"start": started, "end": load_average()},
        "args": vars(args),
        "results": results,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary["load_average"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
