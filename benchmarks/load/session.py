"""From parsed arguments to a finished run: workload, plan, configurations, the runs, the
transformers baseline, and the files."""

from __future__ import annotations

import argparse
import logging
import os
import platform
import time
from pathlib import Path
from typing import Any

from benchmarks.load import regime
from benchmarks.load.client import ClientOptions
from benchmarks.load.configs import DEFAULT_CONFIGS, select_configs
from benchmarks.load.contents import ContentLibrary
from benchmarks.load.metrics import parse_slo
from benchmarks.load.phases import parse_phases
from benchmarks.load.plan import (
    ClosedLoopPlan,
    LengthRule,
    TokenCounter,
    make_plan,
    usable_items,
    warmup_requests,
)
from benchmarks.load.results import BaselineRow, BenchResult
from benchmarks.load.runner import Outputs, RunSettings, finish, run_configs, stamp
from benchmarks.load.trio import TrioOptions
from benchmarks.load.workloads import load_workload
from nightjar.options import engine_options

log = logging.getLogger(__name__)


class BenchError(Exception):
    """A problem with the inputs, reported in one line."""


def token_counter(model_dir: str) -> TokenCounter:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    return lambda text: len(tok(text, add_special_tokens=False)["input_ids"])


def machine() -> str:
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (
        f"{platform.node()} ({platform.machine()}, {os.cpu_count()} CPUs, {gpu}); Python "
        f"{platform.python_version()}, torch {torch.__version__} with {torch.get_num_threads()} threads"
    )


def run(args: argparse.Namespace, out_dir: Path, command: str) -> tuple[BenchResult, Outputs]:
    started, t_start = stamp(), time.monotonic()
    if not (Path(args.model) / "config.json").is_file():
        raise BenchError(f"no model at {args.model} (pass --model DIR with a config.json)")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    phases = parse_phases(args.phases)
    specs = regime.config_specs(args)
    configs, skipped = select_configs(specs or list(DEFAULT_CONFIGS), skip_unregistered=specs is None)
    if args.workload is None and not all(p.content for p in phases):
        raise BenchError("give a WORKLOAD file, or a content for every phase (name:load:seconds:content)")
    workload = load_workload(args.workload) if args.workload else None
    count = token_counter(args.model)
    items = usable_items(workload, count, args.max_prompt_tokens or None) if workload else []
    if workload and not items:
        raise BenchError(f"no prompt of {args.workload} fits --max-prompt-tokens {args.max_prompt_tokens}")
    lengths = LengthRule(args.lengths, args.max_tokens, min(args.min_tokens, args.max_tokens))
    library = ContentLibrary(args.data_dir, args.seed)
    plan = make_plan(items, phases, args.seed, lengths, count, library, args.max_prompt_tokens or None)
    if not plan:
        raise BenchError("the phase plan gives no arrivals: raise a rate or a duration")
    warmups = warmup_requests(items or [r.item for r in plan], args.warmup, args.warmup_tokens)
    pins = regime.pinning(args)
    threads = args.threads or (len(pins.worker.split(",")) if pins.worker else None)
    settings = RunSettings(
        phases=phases,
        trio=TrioOptions(
            args.model,
            max_jobs=args.max_jobs,
            engine=engine_options(args.engine_opt),
            threads=threads,
            worker_cpus=pins.worker,
            other_cpus=pins.others,
            drafters=regime.bundled_drafter_dirs(args.model) if args.services != "processes" else (),
        ),
        client=ClientOptions(endpoint=args.endpoint, temperature=args.temperature),
        drain_timeout_s=args.drain_timeout,
        bin_s=args.bin,
        target=args.target,
        tolerance=args.tolerance,
        progress=not args.no_progress,
        services=args.services,
        redis_url=args.redis_url,
        log_dir=out_dir / "logs",
        slo=parse_slo(args.slo),
    )
    if args.services == "processes" and not (args.redis_url or "").startswith(
        ("redis://", "rediss://", "unix://")
    ):
        raise BenchError("--services processes needs --redis-url redis://HOST:PORT/DB (a real Redis)")
    for note in skipped:
        log.warning("%s", note)
    deadline = t_start + args.time_budget if args.time_budget else None
    own = os.sched_getaffinity(0)
    try:
        if pins.others:  # the load client (this process) keeps off the worker's core
            os.sched_setaffinity(0, {int(c) for c in pins.others.split(",")})
        runs, late = run_configs(configs, plan, warmups, settings, deadline, args.rounds)
    finally:
        os.sched_setaffinity(0, own)
    skipped += late
    if not runs:
        raise BenchError("no configuration ran: " + "; ".join(late))
    baseline: list[BaselineRow] = []
    if deadline is None or time.monotonic() < deadline:
        baseline = _baseline(args, [r.item.prompt for r in plan], [r.max_tokens for r in plan])
    else:
        skipped.append("transformers baseline: skipped, the time budget ran out")
    meta: dict[str, Any] = {
        "command": command,
        "machine": machine(),
        "model": args.model,
        "engine": settings.trio.engine,
        "services": args.services
        + (f" on {args.redis_url}" if args.services == "processes" else " (memory://)"),
        "workload": args.workload or "none (every phase names its content)",
        "workload_format": workload.format if workload else "-",
        "prompts": len(items),
        "content": {p.name: "+".join(p.content) for p in phases if p.content},
        "data_dir": args.data_dir,
        "loop": "closed" if isinstance(plan, ClosedLoopPlan) else "open",
        "slo": settings.slo.describe(),
        "pinning": pins.note,
        "worker_threads": threads,
        "endpoint": args.endpoint,
        "lengths": f"{args.lengths} (max {args.max_tokens})",
        "phases": args.phases,
        "seed": args.seed,
        "requests": len(plan) if not isinstance(plan, ClosedLoopPlan) else "closed loop: as many as answered",
        "warmup": len(warmups),
        "started": started,
    }
    meta["wall_s"] = time.monotonic() - t_start
    return finish(runs, settings, meta, out_dir, skipped, baseline)


def _baseline(args: argparse.Namespace, prompts: list[str], max_tokens: list[int]) -> list[BaselineRow]:
    if not args.hf_baseline:
        return []
    from benchmarks.hf_baseline import BaselineSettings, run_baseline

    bs = BaselineSettings(
        model_dir=args.model,
        chat=args.endpoint == "chat",
        batch_size=args.hf_batch_size,
        requests=args.hf_requests,
        assisted=args.hf_assisted,
        drafter_dir=args.drafter,
    )
    return run_baseline(bs, prompts, max_tokens)
