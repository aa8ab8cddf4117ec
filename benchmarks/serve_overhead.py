"""What serving costs on top of the engine: served time per token against the engine alone.

In one run, for the same model, prompts and output length (greedy, EOS ignored, γ = 0, no
drafters), at concurrency 1 and N:

- engine: the engine stepped in a thread of this process pinned to the worker's core, no
  Redis, no HTTP;
- engine, users spread: the same with its users starting a step apart (``EngineRow``); shown
  beside it, the ratios stay ÷ the plain engine row;
- embedded: ``nightjar up`` (gateway, planner, worker in one process on the embedded store)
  as a separate process pinned to the worker's core;
- redis: gateway, planner and worker as three processes on a real Redis, the worker alone
  on its core, the others (and Redis, and this client) on the rest.

All three are started first and measured in turns (engine, embedded, redis, engine, ...):
at concurrency 1 request by request, at concurrency N round by round, so a machine whose
speed drifts (this VM's does, by the minute) or that runs other work loads each of them
alike; the figures are medians over the requests and rounds. The client sends non-streaming
/v1/completions requests and times each end to end. At concurrency 1 the figure is
milliseconds per output token (a request's whole latency ÷ its tokens, prefill included, for
both the engine and the served runs); at concurrency N it is output tokens per second of N
users each sending ``--per-user`` requests back to back (a closed loop, as
``--max-concurrency`` in vLLM's serving benchmark; the engine row keeps N requests in flight
the same way; ``--per-user 1`` is one burst of N, which mostly measures how fast the gateway
hands the burst over). The ratios are served ÷ engine.

Beside the wall-clock ratios it prints the CPU time the worker's core spent per output token
(all threads of the worker process, or of ``nightjar up``; the engine's thread for the engine
row) — what serving adds on that core, whatever else the machine runs — and the CPU the other
services (gateway, planner, Redis: the other core's share) and this client spent per request.
The load average is printed at the start and at the end.

    python -m benchmarks.serve_overhead --model models/nj-target --redis-url redis://127.0.0.1:6379/3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx

from benchmarks.load.configs import BenchConfig
from benchmarks.load.trio import TrioOptions, free_port, wait_for_decision
from benchmarks.load.trio_procs import process_trio
from benchmarks.procstat import cpu_s, cpus, load_average, pids_matching

PROMPTS = [
    "Once upon a time there was a little fox who",
    "def fibonacci(n):\n    ",
    "The weather in the mountains was",
    "Tom and Lily went to the park to",
]


@dataclass
class Samples:
    """What one row gathered over the rounds."""

    ms_per_token_c1: list[float] = field(default_factory=list)  # one per request at concurrency 1
    cpu_s_c1: list[float] = field(default_factory=list)  # worker-core CPU seconds per c=1 request
    walls_cn: list[float] = field(default_factory=list)  # one per round of N requests
    cpu_s_cn: list[float] = field(default_factory=list)  # worker-core CPU seconds per round of N
    other_cpu_s_cn: list[float] = field(default_factory=list)  # the other services' CPU per round
    client_cpu_s_cn: list[float] = field(default_factory=list)  # this client's CPU per round


@dataclass
class Figures:
    ms_per_token_c1: float  # median over requests at concurrency 1
    tokens_per_s_cn: float  # at concurrency N (requests × tokens ÷ the median round)
    cpu_ms_per_token_c1: float  # worker-core CPU per output token at concurrency 1
    cpu_ms_per_token_cn: float  # worker-core CPU per output token at concurrency N
    other_cpu_ms_per_request_cn: float  # CPU of the gateway, planner and Redis per request
    client_cpu_ms_per_request_cn: float  # CPU of this client (httpx) per request


class EngineRow:
    """The engine alone, in a thread of this process pinned to the worker's core.

    ``spread``: at concurrency N the users start one step apart instead of together. With
    every request of the same length a closed loop in one thread otherwise runs in cohorts
    (the N requests end in one step and are replaced in the next: one prefill of N prompts
    every ``tokens`` steps), while served requests come back one by one, so nearly every
    step also prefills a prompt beside N decode rows; this row is the engine under that
    arrival pattern, with no service and no turnaround."""

    def __init__(self, model: str, tokens: int, cpu: str, spread: bool = False) -> None:
        self.model, self.tokens, self.cpu, self.spread = model, tokens, cpu, spread
        self._engine: Any = None
        self._ids: list[list[int]] = []
        self._n = 0

    def _load(self) -> None:
        os.sched_setaffinity(0, cpus(self.cpu))  # this thread only
        import torch

        from worker.engine_factory import create_engine
        from worker.prompts import PromptEncoder

        torch.set_num_threads(1)
        self._engine = create_engine(self.model, drafters=[], ngram=False)
        enc = PromptEncoder.from_dir(self.model)
        self._ids = [list(enc.tokenizer(p)["input_ids"]) for p in PROMPTS]

    def _run(self, n: int, per_user: int = 1) -> tuple[float, float]:
        """Wall and CPU seconds of ``n`` users' ``per_user`` requests each, stepped to the end:
        ``n`` in flight, a finished request replaced by its user's next (closed loop)."""
        from shared.schemas import SamplingParams
        from worker.engine.api import EngineRequest

        os.sched_setaffinity(0, cpus(self.cpu))
        params = SamplingParams(max_tokens=self.tokens, ignore_eos=True)
        left = n * per_user

        def add(i: int) -> None:
            nonlocal left
            self._n += 1
            left -= 1
            self._engine.add_request(EngineRequest(f"r{self._n}", self._ids[i % len(self._ids)], params))

        waiting = list(range(n))  # users not started yet
        starts = 1 if self.spread else n  # users started a step
        t0, c0 = time.perf_counter(), time.thread_time()
        while waiting or self._engine.has_unfinished():
            for i in waiting[:starts]:
                add(i)
            del waiting[:starts]
            for out in self._engine.step().outputs:
                if out.finished and left > 0:
                    add(left)
        return time.perf_counter() - t0, time.thread_time() - c0

    async def start(self) -> None:
        await anyio.to_thread.run_sync(self._load)
        await anyio.to_thread.run_sync(self._run, 2)  # warm

    async def one_c1(self, samples: Samples, i: int) -> None:
        wall, cpu = await anyio.to_thread.run_sync(self._run, 1)
        samples.ms_per_token_c1.append(wall / self.tokens * 1000)
        samples.cpu_s_c1.append(cpu)

    async def round_cn(self, samples: Samples, concurrency: int, per_user: int) -> None:
        wall, cpu = await anyio.to_thread.run_sync(self._run, concurrency, per_user)
        samples.walls_cn.append(wall)
        samples.cpu_s_cn.append(cpu)
        samples.other_cpu_s_cn.append(0.0)
        samples.client_cpu_s_cn.append(0.0)


class ServedRow:
    """A running deployment behind ``base_url``: ``worker_pids`` on the worker's core,
    ``other_pids`` (gateway, planner, Redis) elsewhere."""

    def __init__(self, client: httpx.AsyncClient, tokens: int, worker_pids: list[int], other_pids: list[int]):
        self.client, self.tokens = client, tokens
        self.worker_pids, self.other_pids = worker_pids, other_pids

    async def one(self, i: int) -> float:
        prompt = PROMPTS[i % len(PROMPTS)]
        body = {"max_tokens": self.tokens, "temperature": 0, "ignore_eos": True, "prompt": prompt}
        t0 = time.perf_counter()
        resp = await self.client.post("/v1/completions", json=body)
        resp.raise_for_status()
        got = resp.json()["usage"]["completion_tokens"]
        if got != self.tokens:
            raise RuntimeError(f"asked {self.tokens} tokens, got {got}")
        return time.perf_counter() - t0

    async def start(self) -> None:
        await self.one(0)
        await self.one(1)  # warm

    async def user(self, i: int, per_user: int) -> None:
        for _ in range(per_user):
            await self.one(i)

    async def one_c1(self, samples: Samples, i: int) -> None:
        c0 = cpu_s(self.worker_pids)
        samples.ms_per_token_c1.append(await self.one(i) / self.tokens * 1000)
        samples.cpu_s_c1.append(cpu_s(self.worker_pids) - c0)

    async def round_cn(self, samples: Samples, concurrency: int, per_user: int) -> None:
        c0 = cpu_s(self.worker_pids)
        o0 = cpu_s(self.other_pids)
        k0 = time.process_time()
        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for i in range(concurrency):
                tg.start_soon(self.user, i, per_user)
        samples.walls_cn.append(time.perf_counter() - t0)
        samples.cpu_s_cn.append(cpu_s(self.worker_pids) - c0)
        samples.other_cpu_s_cn.append(cpu_s(self.other_pids) - o0)
        samples.client_cpu_s_cn.append(time.process_time() - k0)


def _client(base_url: str, concurrency: int) -> httpx.AsyncClient:
    """The load client: one kept-alive connection per user (httpx keeps 20 by default, so
    at 32 users a third of the requests would open a new connection). Idle ones are dropped
    after 2 s, before the gateway's 5 s keep-alive closes them: reusing one the server is
    closing at that moment fails the request (httpx's default expiry is the same 5 s)."""
    limits = httpx.Limits(
        max_connections=concurrency, max_keepalive_connections=concurrency, keepalive_expiry=2.0
    )
    return httpx.AsyncClient(base_url=base_url, timeout=600, limits=limits)


@asynccontextmanager
async def embedded(args: argparse.Namespace, cpu: str) -> AsyncIterator[ServedRow]:
    """``nightjar up`` as its own process on the worker's core."""
    port = free_port()
    cmd = [
        "taskset", "-c", cpu, sys.executable, "-m", "nightjar", "--log-level", "warning", "up",
        "--model", args.model, "--port", str(port), "--threads", "1", "--drafter", "none", "--no-ngram",
        "--policy", "static", "--max-queue", "100000", "--max-jobs", str(args.concurrency),
    ]  # fmt: skip
    log = (Path(args.log_dir) / "embedded.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        async with _client(base, args.concurrency) as c:
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"nightjar up exited ({proc.returncode}); see {log.name}")
                try:
                    if (await c.get("/health")).json().get("workers", 0) >= 1:
                        break
                except (httpx.HTTPError, ValueError):
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError("nightjar up did not come up")
                await anyio.sleep(0.2)
            yield ServedRow(c, args.tokens, [proc.pid], [])
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


@dataclass
class PlainTrio:
    """The three services up on a real Redis (γ = 0, no drafters), and their process ids."""

    base_url: str
    pids: dict[str, list[int]]  # "worker", "gateway", "planner", "redis"


@asynccontextmanager
async def plain_trio(args: argparse.Namespace, cpu: str, name: str) -> AsyncIterator[PlainTrio]:
    """Gateway, planner and worker as processes on ``args.redis_url``, the worker alone on
    ``cpu``, once the planner's first decision is out (``args``: model, concurrency, log_dir)."""
    cfg = BenchConfig(name=name, policy="static", params={})
    opts = TrioOptions(
        model_dir=args.model,
        max_jobs=args.concurrency,
        threads=1,
        engine={"drafters": [], "ngram": False},
        worker_cpus=cpu,
    )
    async with process_trio(cfg, opts, args.redis_url, Path(args.log_dir)) as trio:
        await wait_for_decision(trio.redis, time.monotonic() + 60)
        base = "nightjar --log-level warning"
        services = ("worker", "gateway", "planner")
        pids = {s: pids_matching(f"{base} {s} .*--redis-url {args.redis_url}") for s in services}
        pids["redis"] = [int((await trio.redis.info("server"))["process_id"])]
        yield PlainTrio(trio.base_url, pids)


@asynccontextmanager
async def three_processes(args: argparse.Namespace, cpu: str) -> AsyncIterator[ServedRow]:
    async with plain_trio(args, cpu, "overhead") as trio:
        others = trio.pids["gateway"] + trio.pids["planner"] + trio.pids["redis"]
        async with _client(trio.base_url, args.concurrency) as c:
            yield ServedRow(c, args.tokens, trio.pids["worker"], others)


def figures(s: Samples, tokens: int, n_requests: int) -> Figures:
    """``n_requests``: requests per round at concurrency N (N users × their requests each)."""
    per_request = n_requests * tokens
    return Figures(
        statistics.median(s.ms_per_token_c1),
        per_request / statistics.median(s.walls_cn),
        statistics.mean(s.cpu_s_c1) / tokens * 1000,  # (a mean: /proc counts in 10 ms ticks)
        statistics.median(s.cpu_s_cn) / per_request * 1000,
        statistics.median(s.other_cpu_s_cn) / n_requests * 1000,
        statistics.median(s.client_cpu_s_cn) / n_requests * 1000,
    )


async def measure(args: argparse.Namespace, worker_cpu: str) -> dict[str, Figures]:
    rows: dict[str, EngineRow | ServedRow] = {
        "engine": EngineRow(args.model, args.tokens, worker_cpu),
        "engine, users spread": EngineRow(args.model, args.tokens, worker_cpu, spread=True),
    }
    async with AsyncExitStack() as stack:
        starts: list[Callable[[], Awaitable[None]]] = [row.start for row in rows.values()]
        if not args.skip_embedded:
            rows["embedded"] = await stack.enter_async_context(embedded(args, worker_cpu))
        if args.redis_url:
            rows["redis"] = await stack.enter_async_context(three_processes(args, worker_cpu))
        starts += [row.start for row in rows.values() if isinstance(row, ServedRow)]
        for start in starts:
            await start()
        samples = {name: Samples() for name in rows}
        for _ in range(args.rounds):  # in turns: a change of the machine's speed hits every row
            for i in range(args.requests):  # at c=1 request by request (this VM drifts by the minute)
                for name, row in rows.items():
                    await row.one_c1(samples[name], i)
            for name, row in rows.items():
                await row.round_cn(samples[name], args.concurrency, args.per_user)
    n_requests = args.concurrency * args.per_user
    return {name: figures(s, args.tokens, n_requests) for name, s in samples.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="models/nj-target")
    p.add_argument("--redis-url", default=None, help="a real Redis for the three-process row")
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--requests", type=int, default=10, help="requests at concurrency 1, per round")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--rounds", type=int, default=5, help="rounds (each: the c=1 requests, then N users)")
    p.add_argument(
        "--per-user",
        type=int,
        default=4,
        help="requests each of the N users sends back to back (closed loop); 1: one burst of N",
    )
    p.add_argument("--worker-cpu", default=None, help="the worker's core (default: the last one)")
    p.add_argument("--log-dir", default="/tmp/nightjar-overhead")
    p.add_argument("--json", default=None, help="also write the figures here")
    p.add_argument("--skip-embedded", action="store_true")
    args = p.parse_args(argv)
    Path(args.log_dir).mkdir(parents=True, exist_ok=True)
    cores = sorted(os.sched_getaffinity(0))
    worker_cpu = args.worker_cpu or str(cores[-1])
    rest = ",".join(str(c) for c in cores if str(c) != worker_cpu) or worker_cpu
    load_before = load_average()
    os.sched_setaffinity(0, cpus(rest))  # the client; the engine row's thread pins itself
    rows = anyio.run(measure, args, worker_cpu)
    base = rows["engine"]
    print(
        f"model {args.model}, {args.tokens} output tokens, greedy, γ = 0; worker on core {worker_cpu}, "
        f"client/gateway/planner/Redis on {rest}; {args.rounds} rounds in turns of {args.requests} requests "
        f"at c=1 and {args.concurrency} users × {args.per_user} back to back; "
        f"load average {load_before} before, {load_average()} after"
    )
    n = args.concurrency
    print(
        f"| run | ms/token c=1 | ÷ engine | tokens/s c={n} | ÷ engine | worker-core CPU ms/token c=1 "
        f"| ÷ engine | c={n} | ÷ engine | other CPU ms/request c={n} | client CPU ms/request c={n} |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, f in rows.items():
        print(
            f"| {name} | {f.ms_per_token_c1:.2f} | {f.ms_per_token_c1 / base.ms_per_token_c1:.2f} "
            f"| {f.tokens_per_s_cn:.0f} | {f.tokens_per_s_cn / base.tokens_per_s_cn:.2f} "
            f"| {f.cpu_ms_per_token_c1:.3f} | {f.cpu_ms_per_token_c1 / base.cpu_ms_per_token_c1:.2f} "
            f"| {f.cpu_ms_per_token_cn:.3f} | {f.cpu_ms_per_token_cn / base.cpu_ms_per_token_cn:.2f} "
            f"| {f.other_cpu_ms_per_request_cn:.2f} | {f.client_cpu_ms_per_request_cn:.2f} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({k: vars(v) for k, v in rows.items()}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
