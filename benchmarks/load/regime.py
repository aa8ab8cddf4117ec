"""Options of regime workloads (load and content both change): the content library, the
generated line-up of configurations, the SLO, and CPU pinning of the services.

``add_args`` adds the flags to ``nightjar bench``'s parser; the other functions turn parsed
arguments into what the session needs.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field

from benchmarks.load.configs import lineup
from shared.settings import EnvSettings

REPO = Path(__file__).resolve().parents[2]
DEFAULT_DATA = REPO.parent / "shared" / "data"
DEFAULT_SLO = "ttft=2,tpot=0.2"


class BenchEnv(EnvSettings):
    """The benchmark's defaults that NIGHTJAR_* variables may set (read once)."""

    model: str = Field(default=str(REPO / "models" / "nj-target"), description="model dir")
    bench_data: str = Field(default=str(DEFAULT_DATA), description="shared data for phase content")


def add_args(p: argparse.ArgumentParser, env: BenchEnv) -> None:
    p.add_argument("--data-dir", default=env.bench_data,
                   help="shared data for phase content (chat, code, stories, Spec-Bench ...; "
                   "env NIGHTJAR_BENCH_DATA)")  # fmt: skip
    p.add_argument("--lineup", action="store_true",
                   help="run the generated line-up: no-spec, every (γ, drafter) static pair, threshold, "
                   "cost-model, nightjar (ignored when --config is given)")  # fmt: skip
    p.add_argument("--gammas", default="2,4", help="--lineup: the static γ values per drafter")
    p.add_argument("--drafters", default=None,
                   help="--lineup: comma-separated drafters; None: ngram and the bundled ones")  # fmt: skip
    p.add_argument("--slo", default=DEFAULT_SLO, help="goodput SLO: ttft=SECONDS,tpot=SECONDS")
    p.add_argument("--worker-cpu", default="last",
                   help="processes: taskset CPU list of the worker ('last': the last core; 'none': no "
                   "pinning); gateway, planner and the load client get the other cores")  # fmt: skip


def model_drafters(model_dir: str) -> list[str]:
    """The drafter names a worker of ``model_dir`` offers: n-gram and its bundled drafters."""
    from nightjar.options import drafter_dirs as _drafter_dirs

    return ["ngram", *(Path(d).name for d in _drafter_dirs(model_dir, None))]


def bundled_drafter_dirs(model_dir: str) -> tuple[str, ...]:
    from nightjar.options import drafter_dirs as _drafter_dirs

    return tuple(_drafter_dirs(model_dir, None))


def config_specs(args: argparse.Namespace) -> list[str] | None:
    """``--config`` values, else the generated line-up with ``--lineup``, else None (defaults)."""
    if args.config:
        return list(args.config)
    if not args.lineup:
        return None
    try:
        gammas = [int(g) for g in str(args.gammas).split(",") if g.strip()]
    except ValueError:
        raise ValueError(f"--gammas takes integers, got {args.gammas!r}") from None
    if not gammas or any(g < 1 for g in gammas):
        raise ValueError("--gammas needs at least one γ ≥ 1")
    drafters = [d.strip() for d in args.drafters.split(",") if d.strip()] if args.drafters else None
    return lineup(drafters or model_drafters(args.model), gammas)


@dataclass(frozen=True)
class Pinning:
    worker: str | None  # taskset list of the worker process
    others: str | None  # of gateway, planner and the load client
    note: str  # what the report says beside the numbers


def cpu_list(cpus: list[int]) -> str:
    return ",".join(str(c) for c in cpus)


def pinning(args: argparse.Namespace, available: list[int] | None = None) -> Pinning:
    """The worker on its own core(s), everything the benchmark starts on the others."""
    cpus = sorted(available if available is not None else os.sched_getaffinity(0))
    if args.services != "processes":
        note = "in-process services: worker, gateway, planner and load client share one process, not pinned"
        return Pinning(None, None, note + " (--services processes puts the worker on its own core)")
    choice = str(args.worker_cpu).strip().lower()
    if choice == "none" or len(cpus) < 2:
        why = "--worker-cpu none" if choice == "none" else f"only {len(cpus)} CPU"
        return Pinning(None, None, f"not pinned ({why})")
    if choice == "last":
        worker = [cpus[-1]]
    else:
        try:
            worker = sorted({int(c) for c in choice.split(",") if c.strip()})
        except ValueError:
            raise ValueError(f"--worker-cpu takes last, none or CPUs like 3,4: {args.worker_cpu!r}") from None
        if not worker or not set(worker) <= set(cpus) or set(worker) == set(cpus):
            raise ValueError(f"--worker-cpu {args.worker_cpu!r}: CPUs of {cpu_list(cpus)}, leaving one free")
    others = [c for c in cpus if c not in worker]
    note = (f"worker process pinned to CPU {cpu_list(worker)} (taskset); gateway, planner and the load "
            f"client on CPU {cpu_list(others)}; Redis is not started by the benchmark (pin it apart "
            f"from the worker, e.g. taskset -c {others[0]} redis-server)")  # fmt: skip
    return Pinning(cpu_list(worker), cpu_list(others), note)
