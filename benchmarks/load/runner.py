"""Runs the benchmark: each configuration against a fresh in-process trio, the same plan
replayed against each, then the numbers, the verdict and the files."""

from __future__ import annotations

import logging
import sys
import time
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from tqdm import tqdm

from benchmarks.load import plots
from benchmarks.load.client import ClientOptions, RequestRecord
from benchmarks.load.collector import StreamCollector
from benchmarks.load.configs import BenchConfig
from benchmarks.load.driver import drive_plan, new_client, warm_up
from benchmarks.load.metrics import Slo, config_stats, makespan
from benchmarks.load.phases import Phase, is_closed_loop, windows
from benchmarks.load.plan import ClosedLoopPlan, Plan, PlannedRequest
from benchmarks.load.report import write_markdown
from benchmarks.load.results import BaselineRow, BenchResult, ConfigRun, write_json, write_telemetry
from benchmarks.load.rounds import median_run, order
from benchmarks.load.timeline import build_timeline
from benchmarks.load.trio import Trio, TrioOptions, running_trio
from benchmarks.load.trio_procs import process_trio
from benchmarks.load.verdict import TOLERANCE, judge

log = logging.getLogger(__name__)


@dataclass
class RunSettings:
    phases: list[Phase]
    trio: TrioOptions
    client: ClientOptions = field(default_factory=ClientOptions)
    drain_timeout_s: float = 300.0
    request_timeout_s: float = 600.0
    bin_s: float = 1.0
    target: str = "nightjar"
    tolerance: float = TOLERANCE
    progress: bool = True
    services: str = "inprocess"  # or "processes": three nightjar processes on ``redis_url``
    redis_url: str | None = None
    log_dir: Path = Path("runs/bench-logs")  # the service processes' logs
    slo: Slo = field(default_factory=Slo)  # goodput counts the requests within it


@dataclass
class Outputs:
    json: Path
    markdown: Path
    timeline_png: Path
    cdf_png: Path
    telemetry: Path


def services(cfg: BenchConfig, s: RunSettings) -> AbstractAsyncContextManager[Trio]:
    """Fresh services for ``cfg``: in this process on an embedded Redis, or as processes."""
    if s.services == "processes":
        if not s.redis_url:
            raise ValueError("--services processes needs --redis-url redis://HOST:PORT/DB")
        return process_trio(cfg, s.trio, s.redis_url, s.log_dir)
    return running_trio(cfg, s.trio)


async def run_config(
    cfg: BenchConfig, plan: Plan, warmups: list[PlannedRequest], s: RunSettings
) -> ConfigRun:
    """One configuration: fresh services, warm-up, the timed replay, the streams read meanwhile."""
    async with services(cfg, s) as trio, new_client(trio.base_url, s.request_timeout_s) as client:
        warmup_errors = await warm_up(client, warmups, s.client) if warmups else []
        collector = StreamCollector(trio.redis)
        stop = anyio.Event()
        total = None if isinstance(plan, ClosedLoopPlan) else len(plan)
        bar = tqdm(total=total, desc=cfg.name, unit="req", file=sys.stderr, disable=not s.progress)
        failed = 0

        def done(rec: RequestRecord) -> None:
            nonlocal failed
            failed += not rec.ok
            bar.update(1)
            if failed:
                bar.set_postfix(failed=failed)

        async with anyio.create_task_group() as tg:
            tg.start_soon(collector.run, stop)
            result = await drive_plan(client, plan, s.client, drain_timeout_s=s.drain_timeout_s, on_done=done)
            await anyio.sleep(0.5)  # the last steps' telemetry is published after their tokens
            stop.set()
        bar.close()
    ws = result.windows or windows(s.phases)  # closed loop: where each phase really ran
    records = result.records
    stats = config_stats(records, collector.telemetry, collector.decisions, result.t0_wall, ws, s.slo,
                         capacity=result.windows is not None)  # fmt: skip
    end = max(makespan(records), ws[-1].end_s)
    timeline = build_timeline(records, collector.telemetry, collector.decisions, result.t0_wall, end, s.bin_s)
    return ConfigRun(
        cfg,
        result.t0_wall,
        end,
        records,
        collector.telemetry,
        collector.decisions,
        stats,
        timeline,
        warmup_errors,
        result.windows,
    )


def run_configs(
    configs: list[BenchConfig],
    plan: Plan,
    warmups: list[PlannedRequest],
    s: RunSettings,
    deadline: float | None = None,
    rounds: int = 1,
) -> tuple[list[ConfigRun], list[str]]:
    """Run each configuration in turn, ``rounds`` times (rounds.py: every other round in
    reverse, each phase judged at its median round); one that fails, or that would end past
    ``deadline`` (monotonic seconds, judged by the longest configuration so far), gets a
    note instead (a configuration missing a round is judged on the rounds it ran)."""
    done: dict[str, list[ConfigRun]] = {}
    notes: list[str] = []
    longest = 0.0
    by_name = {cfg.name: cfg for cfg in configs}
    for rnd in range(rounds):
        for cfg in (by_name[n] for n in order(list(by_name), rnd)):
            tag = f"{cfg.name}" + (f" (round {rnd + 1})" if rounds > 1 else "")
            if deadline is not None and time.monotonic() + longest > deadline:
                notes.append(f"{tag}: skipped, the time budget would run out")
                log.warning("%s", notes[-1])
                continue
            log.info("running %s%s", cfg.spec(), f" (round {rnd + 1} of {rounds})" if rounds > 1 else "")
            started = time.monotonic()
            try:
                # A fresh event loop per configuration: nothing of one run can linger into the next.
                result = anyio.run(run_config, cfg, plan, warmups, s)
                done.setdefault(cfg.name, []).append(result)
            except Exception as exc:  # one broken configuration must not cost the others' results
                log.exception("configuration %s failed", cfg.name)
                notes.append(f"{tag}: failed: {type(exc).__name__}: {exc}")
            longest = max(longest, time.monotonic() - started)
    return [median_run(done[c.name]) for c in configs if c.name in done], notes


def finish(
    runs: list[ConfigRun],
    s: RunSettings,
    meta: dict[str, object],
    out_dir: Path,
    skipped: list[str],
    baseline: list[BaselineRow],
) -> tuple[BenchResult, Outputs]:
    """Judge the claim and write results.json, report.md and the two plots into ``out_dir``."""
    statics = [r.config.name for r in runs if r.config.is_static]
    no_spec = [r.config.name for r in runs if r.config.is_no_spec]
    mode = "closed" if is_closed_loop(s.phases) else "open"
    stats = {r.config.name: r.stats for r in runs}
    verdict = judge(stats, statics, s.target, s.tolerance, mode=mode, no_spec=no_spec)
    result = BenchResult(dict(meta), runs, verdict, skipped, baseline)
    out_dir.mkdir(parents=True, exist_ok=True)
    ws = windows(s.phases)
    outputs = Outputs(
        json=write_json(result, out_dir / "results.json"),
        markdown=write_markdown(result, out_dir / "report.md"),
        timeline_png=plots.plot_timelines(runs, ws, out_dir / "timeline.png"),
        cdf_png=plots.plot_cdfs(runs, out_dir / "latency_cdf.png"),
        telemetry=write_telemetry(result, out_dir / "telemetry.jsonl"),
    )
    return result, outputs


def stamp() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %Z")
