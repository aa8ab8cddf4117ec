"""The gateway's own CPU per non-streaming /v1/completions request, on a real Redis.

Starts the three services as ``benchmarks/serve_overhead.py`` does (``process_trio``: the
worker alone on the last core, gateway, planner and this client on the others; γ = 0, no
drafters), then sends ``--requests`` requests one at a time (c=1) and ``--concurrency``
users × ``--per-user`` requests back to back (closed loop), and prints, for each, the
CPU the gateway process, the planner and Redis spent per request (``/proc/PID/stat``
utime + stime, so in 10 ms ticks: use enough requests), the client's own, and the
requests' latency. ``--py-spy FILE`` also records the gateway with py-spy (raw format)
during the c=1 part and the closed loop.

    python -m benchmarks.gateway_cpu --redis-url redis://127.0.0.1:6379/7
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time

import anyio
import httpx

from benchmarks.procstat import cpu_s, load_average, system_cpu_s
from benchmarks.serve_overhead import PROMPTS, _client, plain_trio


async def _one(c: httpx.AsyncClient, i: int, tokens: int) -> float:
    body = {"max_tokens": tokens, "temperature": 0, "ignore_eos": True, "prompt": PROMPTS[i % len(PROMPTS)]}
    t0 = time.perf_counter()
    resp = await c.post("/v1/completions", json=body)
    resp.raise_for_status()
    if resp.json()["usage"]["completion_tokens"] != tokens:
        raise RuntimeError("short completion")
    return time.perf_counter() - t0


def _run_s(pid: int) -> float:
    """Seconds ``pid``'s main thread ran on a CPU so far (/proc/PID/schedstat: the scheduler's
    own count, in ns; utime + stime in /proc/PID/stat come in 10 ms ticks)."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


def _switches(pid: int) -> int:
    """Context switches of ``pid``'s main thread so far (each: a wait for I/O or preemption)."""
    with open(f"/proc/{pid}/status") as f:
        got = dict(line.split(":", 1) for line in f if "ctxt_switches" in line)
    return sum(int(v) for v in got.values())


async def _phase(
    name: str, c: httpx.AsyncClient, n: int, users: int, tokens: int, gw: list[int], others: list[int]
) -> None:
    lat: list[float] = []

    async def user(u: int) -> None:
        for k in range(n // users):
            lat.append(await _one(c, u + k, tokens))

    w0, r0 = _switches(gw[0]), _run_s(gw[0])
    g0, s0, o0 = cpu_s(gw), system_cpu_s(gw[0]), cpu_s(others)
    k0, t0 = time.process_time(), time.perf_counter()
    async with anyio.create_task_group() as tg:
        for u in range(users):
            tg.start_soon(user, u)
    wall = time.perf_counter() - t0
    g, o, k = cpu_s(gw) - g0, cpu_s(others) - o0, time.process_time() - k0
    sys_s = system_cpu_s(gw[0]) - s0
    wakes = (_switches(gw[0]) - w0) / n
    ran = _run_s(gw[0]) - r0
    lat.sort()
    print(
        f"{name}: {len(lat)} requests in {wall:.2f}s; gateway CPU {g / len(lat) * 1000:.2f} ms/request "
        f"(scheduler: {ran / len(lat) * 1000:.2f}) "
        f"({sys_s / len(lat) * 1000:.2f} system, {wakes:.1f} context switches), "
        f"planner+Redis {o / len(lat) * 1000:.2f}, client {k / len(lat) * 1000:.2f}; latency p50 "
        f"{lat[len(lat) // 2] * 1000:.0f} ms, p90 {lat[int(len(lat) * 0.9)] * 1000:.0f} ms"
    )


async def run(args: argparse.Namespace, worker_cpu: str) -> None:
    async with plain_trio(args, worker_cpu, "gwcpu") as trio:
        gw, others = trio.pids["gateway"], trio.pids["planner"] + trio.pids["redis"]
        spy = None
        if args.py_spy:
            cmd = [
                "py-spy",
                "record",
                "-p",
                str(gw[0]),
                "-o",
                args.py_spy,
                "--format",
                "raw",
                "-r",
                "1000",
                "--gil",
            ]
            spy = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            async with _client(trio.base_url, args.concurrency) as c:
                for i in range(4):
                    await _one(c, i, args.tokens)  # warm
                g0 = cpu_s(gw)
                await anyio.sleep(args.idle_s)
                if args.idle_s:
                    print(f"idle: gateway CPU {(cpu_s(gw) - g0) / args.idle_s * 1000:.1f} ms/s")
                await _phase("c=1", c, args.requests, 1, args.tokens, gw, others)
                n = args.concurrency * args.per_user
                await _phase(f"c={args.concurrency}", c, n, args.concurrency, args.tokens, gw, others)
        finally:
            if spy is not None:
                spy.send_signal(2)
                spy.wait(timeout=30)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="models/nj-target")
    p.add_argument("--redis-url", required=True)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--requests", type=int, default=60, help="requests at concurrency 1")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--per-user", type=int, default=4)
    p.add_argument("--idle-s", type=float, default=0.0, help="first measure the idle gateway this long")
    p.add_argument("--py-spy", default=None, help="record the gateway to this file (py-spy raw format)")
    p.add_argument("--log-dir", default="/tmp/nightjar-gwcpu")
    args = p.parse_args(argv)
    cores = sorted(os.sched_getaffinity(0))
    worker_cpu = str(cores[-1])
    rest = {c for c in cores if str(c) != worker_cpu} or {cores[-1]}
    print(f"load average before {load_average()}")
    os.sched_setaffinity(0, rest)  # the client, and the gateway and planner it starts
    anyio.run(run, args, worker_cpu)
    print(f"load average after {load_average()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
