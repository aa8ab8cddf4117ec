"""Many workers on the synthetic engine in one process, for the control-plane benchmark.

Each is a whole ``WorkerService`` — its own Redis client, intake, leases, outbox, telemetry,
heartbeats, decisions — on a ``SyntheticEngine`` that sleeps each step's cost-profile time
instead of computing it (worker/engine/synthetic.py), so one process hosts dozens. They
share one tokenizer (of ``--model``: prompts are tokenized and outputs detokenized for real).
Steps run in threads (a step of at least 20 ms always does, worker/service.py), so the
thread limiter is raised to two per worker. SIGTERM drains them all, as it does one worker.

    python -m benchmarks.fake_workers --redis-url redis://127.0.0.1:7000/0 --model models/nj-target \\
        --count 32 --prefix host0 --base-ms 20 --per-seq-ms 0.15 --max-jobs 64
"""

from __future__ import annotations

import argparse
import logging

import anyio
import anyio.to_thread

from nightjar.runner import Service, Stop, run_services, use_uvloop
from worker.engine.synthetic import SyntheticEngine, linear_profile
from worker.prompts import PromptEncoder
from worker.service import WorkerService
from worker.settings import WorkerSettings


def build(args: argparse.Namespace) -> list[WorkerService]:
    prompts = PromptEncoder.from_dir(args.model)
    profile = linear_profile(args.base_ms, args.per_seq_ms, args.max_jobs, model=args.served_model_name)
    workers = []
    for i in range(args.count):
        settings = WorkerSettings(
            model_dir=args.model,
            redis_url=args.redis_url,
            worker_id=f"{args.prefix}-{i}",
            model_name=args.served_model_name,
            max_jobs=args.max_jobs,
            drain_timeout_s=5.0,
        )
        engine = SyntheticEngine(profile, max_batch=args.max_jobs)
        workers.append(WorkerService(settings, engine=engine, prompts=prompts))
    return workers


async def serve(workers: list[WorkerService]) -> None:
    anyio.to_thread.current_default_thread_limiter().total_tokens = max(40, 2 * len(workers))
    drainers: list[tuple[Service, Stop]] = [(w.run, w.request_stop) for w in workers]
    await run_services([], None, drainers)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.fake_workers", description=__doc__.split("\n")[0])
    p.add_argument("--redis-url", required=True)
    p.add_argument("--model", required=True, help="a model directory: its tokenizer only")
    p.add_argument("--served-model-name", default="synthetic")
    p.add_argument("--count", type=int, default=8)
    p.add_argument("--prefix", default="fake")
    p.add_argument("--base-ms", type=float, default=20.0, help="a step's fixed cost")
    p.add_argument("--per-seq-ms", type=float, default=0.15, help="... plus this per running sequence")
    p.add_argument("--max-jobs", type=int, default=64)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    workers = build(args)
    anyio.run(serve, workers, backend_options={"use_uvloop": use_uvloop()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
