"""What serving costs on top of the engine: served time per token against the engine alone.

In one run, for the same model, prompts and output length (greedy, EOS ignored, γ = 0, no
drafters), at concurrency 1 and N:

- engine: the engine stepped in this process (on the worker's core), no Redis, no HTTP;
- embedded: ``nightjar up`` (gateway, planner, worker in one process on the embedded store)
  as a separate process pinned to the worker's core;
- redis: gateway, planner and worker as three processes on a real Redis, the worker alone
  on its core, the others (and Redis, and this client) on the rest.

The client sends non-streaming /v1/completions requests and times each end to end. At
concurrency 1 the figure is milliseconds per output token (a request's whole latency ÷ its
tokens, prefill included, for both the engine and the served runs); at concurrency N it is
output tokens per second. The ratios are served ÷ engine, printed side by side.

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
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx

from benchmarks.load.configs import BenchConfig
from benchmarks.load.trio import TrioOptions, free_port, wait_for_decision
from benchmarks.load.trio_procs import process_trio

PROMPTS = [
    "Once upon a time there was a little fox who",
    "def fibonacci(n):\n    ",
    "The weather in the mountains was",
    "Tom and Lily went to the park to",
]


@dataclass
class Figures:
    ms_per_token_c1: float  # median over requests at concurrency 1
    tokens_per_s_cn: float  # at concurrency N


def _cpus(spec: str) -> set[int]:
    return {int(c) for c in spec.split(",") if c.strip()}


def engine_figures(model: str, tokens: int, requests: int, concurrency: int, rounds: int) -> Figures:
    """The engine alone, stepped to completion in this process."""
    import torch

    from shared.schemas import SamplingParams
    from worker.engine.api import EngineRequest
    from worker.engine_factory import create_engine
    from worker.prompts import PromptEncoder

    torch.set_num_threads(1)
    engine = create_engine(model, drafters=[], ngram=False)
    enc = PromptEncoder.from_dir(model)
    ids = [list(enc.tokenizer(p)["input_ids"]) for p in PROMPTS]
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)

    def run(n: int, tag: str) -> float:
        for i in range(n):
            engine.add_request(EngineRequest(f"{tag}-{i}", ids[i % len(ids)], params))
        t0 = time.perf_counter()
        while engine.has_unfinished():
            engine.step()
        return time.perf_counter() - t0

    run(2, "warm")
    per_token = [run(1, f"c1-{i}") / tokens * 1000 for i in range(requests)]
    walls = [run(concurrency, f"cn-{r}") for r in range(rounds)]
    return Figures(statistics.median(per_token), concurrency * tokens / statistics.median(walls))


async def client_figures(base_url: str, tokens: int, requests: int, concurrency: int, rounds: int) -> Figures:
    body = {"max_tokens": tokens, "temperature": 0, "ignore_eos": True}

    async with httpx.AsyncClient(base_url=base_url, timeout=600) as client:

        async def one(i: int) -> float:
            t0 = time.perf_counter()
            resp = await client.post("/v1/completions", json={**body, "prompt": PROMPTS[i % len(PROMPTS)]})
            resp.raise_for_status()
            got = resp.json()["usage"]["completion_tokens"]
            if got != tokens:
                raise RuntimeError(f"asked {tokens} tokens, got {got}")
            return time.perf_counter() - t0

        await one(0)
        await one(1)  # warm
        per_token = [await one(i) / tokens * 1000 for i in range(requests)]
        walls = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for i in range(concurrency):
                    tg.start_soon(one, i)
            walls.append(time.perf_counter() - t0)
    return Figures(statistics.median(per_token), concurrency * tokens / statistics.median(walls))


async def embedded_figures(args: argparse.Namespace, cpu: str) -> Figures:
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
        async with httpx.AsyncClient(base_url=base, timeout=5) as c:
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
        return await client_figures(base, args.tokens, args.requests, args.concurrency, args.rounds)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


async def redis_figures(args: argparse.Namespace, cpu: str) -> Figures:
    cfg = BenchConfig(name="overhead", policy="static", params={})
    opts = TrioOptions(
        model_dir=args.model,
        max_jobs=args.concurrency,
        threads=1,
        engine={"drafters": [], "ngram": False},
        worker_cpus=cpu,
    )
    async with process_trio(cfg, opts, args.redis_url, Path(args.log_dir)) as trio:
        await wait_for_decision(trio.redis, time.monotonic() + 60)
        return await client_figures(trio.base_url, args.tokens, args.requests, args.concurrency, args.rounds)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="models/nj-target")
    p.add_argument("--redis-url", default=None, help="a real Redis for the three-process row")
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--requests", type=int, default=30, help="requests at concurrency 1")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--rounds", type=int, default=5, help="rounds of --concurrency requests")
    p.add_argument("--worker-cpu", default=None, help="the worker's core (default: the last one)")
    p.add_argument("--log-dir", default="/tmp/nightjar-overhead")
    p.add_argument("--json", default=None, help="also write the figures here")
    p.add_argument("--skip-embedded", action="store_true")
    args = p.parse_args(argv)
    Path(args.log_dir).mkdir(parents=True, exist_ok=True)
    cores = sorted(os.sched_getaffinity(0))
    worker_cpu = args.worker_cpu or str(cores[-1])
    rest = ",".join(str(c) for c in cores if str(c) != worker_cpu) or worker_cpu
    os.sched_setaffinity(0, _cpus(worker_cpu))  # the engine-only row runs where the worker will
    rows = {"engine": engine_figures(args.model, args.tokens, args.requests, args.concurrency, args.rounds)}
    os.sched_setaffinity(0, _cpus(rest))  # the client from now on
    if not args.skip_embedded:
        rows["embedded"] = anyio.run(embedded_figures, args, worker_cpu)
    if args.redis_url:
        rows["redis"] = anyio.run(redis_figures, args, worker_cpu)
    base = rows["engine"]
    print(f"model {args.model}, {args.tokens} output tokens, greedy, γ = 0; worker on core {worker_cpu}, "
          f"client/gateway/planner/Redis on {rest}")  # fmt: skip
    print(f"| run | ms/token c=1 | ÷ engine | tokens/s c={args.concurrency} | ÷ engine |")
    print("|---|---|---|---|---|")
    for name, f in rows.items():
        print(
            f"| {name} | {f.ms_per_token_c1:.2f} | {f.ms_per_token_c1 / base.ms_per_token_c1:.2f} "
            f"| {f.tokens_per_s_cn:.0f} | {f.tokens_per_s_cn / base.tokens_per_s_cn:.2f} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({k: vars(v) for k, v in rows.items()}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
