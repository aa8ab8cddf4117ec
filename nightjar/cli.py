"""The ``nightjar`` command: run the services, swap the planner's policy, submit a prompt.

Every service flag is a field of that service's settings record (``gateway/settings.py``,
``worker/settings.py``, ``planner/settings.py``; ``nightjar.flags``): its help says what it
does, its default and the ``NIGHTJAR_*`` variable that also sets it. Bad input gives one line
on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import NoReturn

from gateway.settings import GatewaySettings
from nightjar import flags
from nightjar.flags import add
from nightjar.options import DTYPE_CHOICES, UsageError
from nightjar.settings import (
    LogSettings,
    SubmitSettings,
    UpSettings,
    gateway_settings,
    planner_settings,
    worker_settings,
)
from planner.settings import PlannerSettings
from worker.settings import WorkerSettings


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"nightjar: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _add_redis(
    p: argparse.ArgumentParser, cls: type[GatewaySettings | WorkerSettings | PlannerSettings]
) -> None:
    add(p, "--redis-url", cls, "redis_url")


def _add_gateway(p: argparse.ArgumentParser, cls: type[GatewaySettings]) -> None:
    add(p, "--host", cls, "host")
    add(p, "--port", cls, "port", type=int)
    add(p, "--max-queue", cls, "max_queue", type=int)
    add(p, "--max-batch-queue", cls, "max_batch_queue", type=int)
    add(p, "--webhook-secret", cls, "webhook_secret")
    add(
        p,
        "--api-key",
        cls,
        "api_keys",
        action="append",
        metavar="KEY",
        help="an API key the /v1 routes accept (Bearer), repeatable; each key sees only its own jobs; "
        "none: open, with a warning",
    )
    add(p, "--rate-limit", cls, "rate_limit_rps", type=float)
    add(p, "--rate-burst", cls, "rate_limit_burst", type=int)
    add(p, "--auth-failures-per-min", cls, "auth_failures_per_min", type=int)
    add(p, "--metrics-require-key", cls, "metrics_require_key", action=argparse.BooleanOptionalAction)
    add(p, "--docs-require-key", cls, "docs_require_key", action=argparse.BooleanOptionalAction)
    add(p, "--request-timeout", cls, "request_timeout_s", type=float)
    add(p, "--outage-grace", cls, "outage_grace_s", type=float)
    add_result_ttl(p, cls)
    add(p, "--max-body-bytes", cls, "max_body_bytes", type=int)
    add(p, "--max-concurrency", cls, "max_concurrency", type=int)


def add_result_ttl(p: argparse.ArgumentParser, cls: type[GatewaySettings | WorkerSettings]) -> None:
    """``--result-ttl``, once per parser (the gateway and the worker both take it; ``up`` both)."""
    if any(a.dest == "result_ttl_s" for a in p._actions):
        return
    add(p, "--result-ttl", cls, "result_ttl_s", type=float)


def _add_worker(p: argparse.ArgumentParser, cls: type[WorkerSettings]) -> None:
    add(p, "--model", cls, "model_dir", metavar="DIR")
    add(p, "--worker-id", cls, "worker_id", default="HOST-PID")
    add(p, "--served-model-name", cls, "model_name")
    add(p, "--max-jobs", cls, "max_jobs", type=int)
    add(p, "--claim-idle", cls, "claim_idle_s", type=float)
    add(p, "--progress-interval", cls, "progress_s", type=float)
    add(p, "--max-deliveries", cls, "max_deliveries", type=int)
    add(p, "--drain-timeout", cls, "drain_timeout_s", type=float)
    add_result_ttl(p, cls)
    add(p, "--threads", cls, "threads", type=int)
    add(p, "--dtype", cls, "dtype", choices=DTYPE_CHOICES)
    add(
        p,
        "--engine-opt",
        cls,
        "engine",
        action="append",
        metavar="KEY=VALUE",
        help="an engine option (an EngineConfig field; the value read as JSON when it parses), repeatable",
    )
    add(
        p,
        "--drafter",
        cls,
        "drafters",
        action="append",
        metavar="DIR",
        help="a drafter model directory, repeatable; 'none': no model drafter; not given: the bundled "
        "drafters of a bundled model (env: comma-separated)",
    )
    add(p, "--ngram", cls, "ngram", action=argparse.BooleanOptionalAction)
    add(p, "--profile", cls, "profile", action=argparse.BooleanOptionalAction)
    add(p, "--profile-budget", cls, "profile_budget_s", type=float)
    add(p, "--profile-reps", cls, "profile_reps", type=int)
    add(p, "--profile-cache", cls, "profile_cache", action=argparse.BooleanOptionalAction)
    add(p, "--profile-idle", cls, "profile_idle_s", type=float)


def add_metrics_port(p: argparse.ArgumentParser, cls: type[WorkerSettings | PlannerSettings]) -> None:
    """``--metrics-port`` / ``--metrics-host``: where a worker or planner serves /metrics."""
    add(p, "--metrics-port", cls, "metrics_port", type=int)
    add(p, "--metrics-host", cls, "metrics_host")


def _add_planner(p: argparse.ArgumentParser, cls: type[PlannerSettings]) -> None:
    add(p, "--policy", cls, "policy")
    add(
        p,
        "--set",
        cls,
        "params",
        action="append",
        metavar="KEY=VALUE",
        help="a parameter of the policy (docs/planner.md), repeatable",
    )
    add(p, "--valid-for", cls, "valid_for_s", type=float)
    # The capacity estimate: workers each model needs (planner/capacity.py, docs/scaling.md).
    add(p, "--ttft-target", cls, "ttft_target_s", type=float)
    add(p, "--tpot-target", cls, "tpot_target_s", type=float)
    add(p, "--target-utilization", cls, "target_utilization", type=float)
    add(p, "--min-workers", cls, "min_workers", type=int)
    add(p, "--max-workers", cls, "max_workers", type=int)
    add(p, "--plan-models", cls, "plan_models")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="nightjar", description="LLM serving that makes speculative decoding pay off.")
    add(
        p,
        "--log-level",
        LogSettings,
        "log_level",
        type=str.lower,
        choices=["debug", "info", "warning", "error"],
    )
    add(p, "--log-format", LogSettings, "log_format", choices=["plain", "json"])
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")

    up = sub.add_parser(
        "up",
        help="gateway, planner and a worker in one process (embedded Redis)",
        description="Gateway, planner and one worker in one process on an embedded store; "
        "without --model it serves SmolLM2-135M-Instruct with its two heads and the n-gram "
        "drafter (exported on first use; the bundled nj-target when that fails).",
    )
    _add_redis(up, GatewaySettings)
    _add_gateway(up, GatewaySettings)
    _add_worker(up, worker_settings(False))
    _add_planner(up, PlannerSettings)
    add(up, "--share-store", UpSettings, "share_store", action=argparse.BooleanOptionalAction)
    add(up, "--store-port", UpSettings, "store_port", type=int)

    gw = sub.add_parser(
        "gateway", help="the HTTP gateway", description="The HTTP gateway (OpenAI routes, job API)."
    )
    _add_redis(gw, gateway_settings(True))
    _add_gateway(gw, gateway_settings(True))

    wk = sub.add_parser(
        "worker", help="one worker (one per accelerator)", description="One worker: runs the model."
    )
    _add_redis(wk, worker_settings(True))
    _add_worker(wk, worker_settings(True))
    add_metrics_port(wk, WorkerSettings)

    pl = sub.add_parser(
        "planner",
        help="the planner, or `planner use POLICY` to swap its policy",
        description="The planner: decides gamma, drafter and offload from the workers' telemetry.",
    )
    _add_redis(pl, planner_settings(True))
    _add_planner(pl, PlannerSettings)
    add_metrics_port(pl, PlannerSettings)
    pl_sub = pl.add_subparsers(dest="planner_command", parser_class=_Parser, metavar="COMMAND")
    use = pl_sub.add_parser(
        "use",
        help="swap the running planner's policy",
        description="Ask the running planner (through Redis) to swap its policy.",
    )
    use.add_argument("policy", help="the policy to run (docs/planner.md)")
    use.add_argument(
        "--set",
        dest="use_set",
        action="append",
        metavar="KEY=VALUE",
        default=[],
        help="a parameter of the policy, repeatable (default: none: the policy's defaults)",
    )

    sm = sub.add_parser(
        "submit",
        help="stream a completion from a running gateway",
        description="Stream one completion from a running gateway to the terminal.",
    )
    sm.add_argument("prompt", help="the prompt (a chat message with --chat)")
    add(sm, "--url", SubmitSettings, "url")
    add(sm, "--max-tokens", SubmitSettings, "max_tokens", type=int)
    add(sm, "--temperature", SubmitSettings, "temperature", type=float)
    add(sm, "--seed", SubmitSettings, "seed", type=int)
    add(sm, "--chat", SubmitSettings, "chat", action="store_const", const=True)
    add(sm, "--api-key", SubmitSettings, "api_key")

    for name, (_, what) in DELEGATED.items():
        sub.add_parser(name, help=what, add_help=False)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in DELEGATED:
        return _delegate(argv[0], argv[1:])
    args = build_parser().parse_args(argv)
    from shared import logs

    try:
        log_settings = flags.build(LogSettings, **flags.given(args, LogSettings))
    except UsageError as exc:
        print(f"nightjar: error: {exc}", file=sys.stderr)
        return 2
    logs.configure(log_settings.log_level, log_settings.log_format)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is noise here
    from nightjar import commands

    try:
        return int(commands.run(args) or 0)
    except UsageError as exc:
        print(f"nightjar: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


# Subcommands whose arguments another package parses: name -> (module with main(argv) -> int
# and build_parser() -> ArgumentParser, what it does).
DELEGATED = {
    "models": ("training.cli", "build, convert and train the bundled models (training.cli)"),
    "bench": ("benchmarks.load.cli", "benchmark every policy under dynamic load (benchmarks.load)"),
    "top": ("nightjar.top", "a live view of a running deployment: workers, decisions, drafters"),
    "chat": ("nightjar.chat", "chat with a running gateway, tokens coloured by their maker (nightjar.chat)"),
}


def _delegate(command: str, argv: list[str]) -> int:
    import importlib

    try:
        module = importlib.import_module(DELEGATED[command][0])
    except ImportError as exc:
        print(f"nightjar: error: the {command} command is not available: {exc}", file=sys.stderr)
        return 2
    return int(module.main(argv) or 0)
