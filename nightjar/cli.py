"""The ``nightjar`` command: run the services, swap the planner's policy, submit a prompt.

Every option also reads a NIGHTJAR_* environment variable (named in its help). Bad input
gives one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import NoReturn

from nightjar.options import UsageError, env
from shared.connection import DEFAULT_URL


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"nightjar: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _add_redis(p: argparse.ArgumentParser, default: str) -> None:
    p.add_argument("--redis-url", default=env("REDIS_URL", default), help="NIGHTJAR_REDIS_URL")


def _add_gateway(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default=env("HOST", "127.0.0.1"), help="NIGHTJAR_HOST")
    p.add_argument("--port", type=int, default=env("PORT", "8000"), help="NIGHTJAR_PORT")
    p.add_argument("--max-queue", type=int, default=env("MAX_QUEUE", "1000"), help="NIGHTJAR_MAX_QUEUE")
    p.add_argument(
        "--webhook-secret",
        default=env("WEBHOOK_SECRET"),
        help="HMAC-SHA256 key that signs webhook deliveries (NIGHTJAR_WEBHOOK_SECRET); none: unsigned",
    )
    p.add_argument(
        "--api-key",
        action="append",
        metavar="KEY",
        help="an API key the /v1 routes accept (Bearer), repeatable (NIGHTJAR_API_KEYS, comma-separated); "
        "none: open",
    )
    p.add_argument(
        "--rate-limit", type=float, default=env("RATE_LIMIT_RPS", "0"),
        help="requests/s per API key, 0 = no limit (NIGHTJAR_RATE_LIMIT_RPS)",
    )
    p.add_argument(
        "--rate-burst", type=int, default=env("RATE_LIMIT_BURST", "0"),
        help="rate-limit bucket size, 0 = the rate rounded up (NIGHTJAR_RATE_LIMIT_BURST)",
    )
    p.add_argument(
        "--request-timeout", type=float, default=env("REQUEST_TIMEOUT_S", "600"),
        help="seconds before an OpenAI request is cancelled with a 504 (NIGHTJAR_REQUEST_TIMEOUT_S)",
    )
    p.add_argument(
        "--outage-grace", type=float, default=env("OUTAGE_GRACE_S", "30"),
        help="seconds a request in flight rides out a Redis outage, resuming where it was; past "
        "them it is answered 503 and its job cancelled (NIGHTJAR_OUTAGE_GRACE_S; 0: at once)",
    )
    add_result_ttl(p)
    p.add_argument(
        "--max-body-bytes", type=int, default=env("MAX_BODY_BYTES", str(4 * 1024 * 1024)),
        help="larger request bodies get a 413 (NIGHTJAR_MAX_BODY_BYTES)",
    )
    p.add_argument(
        "--max-concurrency", type=int, default=env("MAX_CONCURRENCY", "8192"),
        help="HTTP requests in flight before a 503 (NIGHTJAR_MAX_CONCURRENCY)",
    )


def add_result_ttl(p: argparse.ArgumentParser) -> None:
    """``--result-ttl``, once per parser (the gateway and the worker both take it; ``up`` both)."""
    if any(a.dest == "result_ttl" for a in p._actions):
        return
    p.add_argument(
        "--result-ttl",
        type=float,
        default=env("RESULT_TTL_S", str(24 * 3600)),
        help="seconds a job's record, result and events live after its last write (NIGHTJAR_RESULT_TTL_S)",
    )


def _add_worker(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=env("MODEL"), help="model directory (NIGHTJAR_MODEL)")
    p.add_argument("--worker-id", default=env("WORKER_ID"), help="NIGHTJAR_WORKER_ID")
    p.add_argument(
        "--served-model-name",
        default=env("SERVED_MODEL_NAME", ""),
        help="the model's name in the API (default: the model directory's name; NIGHTJAR_SERVED_MODEL_NAME)",
    )
    p.add_argument("--max-jobs", type=int, default=env("MAX_JOBS", "16"), help="NIGHTJAR_MAX_JOBS")
    p.add_argument(
        "--claim-idle",
        type=float,
        default=env("CLAIM_IDLE_S", "30"),
        help="seconds before another worker takes over the jobs of one that died; claim renewals "
        "(every third of it) and sweeps for orphans (every sixth, at most 2 s) follow from it, so "
        "an orphan resumes within it + 5 s (NIGHTJAR_CLAIM_IDLE_S)",
    )
    p.add_argument(
        "--progress-interval",
        type=float,
        default=env("PROGRESS_S", "0.5"),
        help="seconds between writes of the tokens of a job whose client awaits only its result "
        "(a non-streaming completion); streamed jobs are written every step (NIGHTJAR_PROGRESS_S)",
    )
    p.add_argument(
        "--max-deliveries", type=int, default=env("MAX_DELIVERIES", "3"), help="NIGHTJAR_MAX_DELIVERIES"
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=env("DRAIN_TIMEOUT_S", "30"),
        help="on SIGTERM, seconds to finish running jobs before handing them back (NIGHTJAR_DRAIN_TIMEOUT_S)",
    )
    add_result_ttl(p)
    p.add_argument("--threads", type=int, default=env("THREADS"), help="torch threads (NIGHTJAR_THREADS)")
    p.add_argument("--engine-opt", action="append", metavar="KEY=VALUE", help="engine option")
    p.add_argument(
        "--drafter",
        action="append",
        metavar="DIR",
        help="drafter model directory, repeatable; 'none' for no model drafter (NIGHTJAR_DRAFTERS, "
        "comma-separated; default: the bundled drafters of a bundled model)",
    )
    p.add_argument(
        "--ngram",
        action=argparse.BooleanOptionalAction,
        default=str(env("NGRAM", "1")).lower() not in ("0", "false", "no", "off"),
        help="offer the prompt-lookup drafter 'ngram' (NIGHTJAR_NGRAM)",
    )
    p.add_argument(
        "--profile",
        action=argparse.BooleanOptionalAction,
        default=str(env("PROFILE", "1")).lower() not in ("0", "false", "no", "off"),
        help="measure the startup cost profile, the planner's prior (NIGHTJAR_PROFILE)",
    )
    p.add_argument(
        "--profile-budget",
        type=float,
        default=env("PROFILE_BUDGET_S", "60"),
        help="seconds the startup cost profile may take at most (NIGHTJAR_PROFILE_BUDGET_S)",
    )
    p.add_argument(
        "--profile-reps",
        type=int,
        default=env("PROFILE_REPS", "5"),
        help="rounds of the startup cost profile over the batch sizes, the fastest of each point "
        "kept, within the budget (NIGHTJAR_PROFILE_REPS)",
    )


def add_metrics_port(p: argparse.ArgumentParser) -> None:
    """``--metrics-port`` / ``--metrics-host``: where a worker or planner serves /metrics."""
    p.add_argument(
        "--metrics-port", type=int, default=env("METRICS_PORT"),
        help="serve Prometheus /metrics on this port (NIGHTJAR_METRICS_PORT; default: none)",
    )
    p.add_argument("--metrics-host", default=env("METRICS_HOST", "127.0.0.1"), help="NIGHTJAR_METRICS_HOST")


def _add_planner(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", default=env("POLICY", "nightjar"), help="NIGHTJAR_POLICY (default nightjar)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="policy parameter")
    p.add_argument(
        "--valid-for",
        type=float,
        default=env("DECISION_VALID_FOR_S", "30"),
        help="seconds a decision stays valid: workers fall back to no speculation when the planner "
        "is silent this long (NIGHTJAR_DECISION_VALID_FOR_S)",
    )


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="nightjar", description="LLM serving that makes speculative decoding pay off.")
    p.add_argument(
        "--log-level",
        type=str.lower,
        choices=["debug", "info", "warning", "error"],
        default=env("LOG_LEVEL", "info"),
        help="NIGHTJAR_LOG_LEVEL",
    )
    p.add_argument(
        "--log-format",
        choices=["plain", "json"],
        default=env("LOG_FORMAT", "plain"),
        help="plain lines or one JSON object a line (NIGHTJAR_LOG_FORMAT)",
    )
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    up = sub.add_parser("up", help="gateway, planner and a worker in one process (embedded Redis)")
    _add_redis(up, DEFAULT_URL)
    _add_gateway(up)
    _add_worker(up)
    _add_planner(up)

    gw = sub.add_parser("gateway", help="the HTTP gateway")
    _add_redis(gw, "redis://127.0.0.1:6379/0")
    _add_gateway(gw)

    wk = sub.add_parser("worker", help="one worker (one per accelerator)")
    _add_redis(wk, "redis://127.0.0.1:6379/0")
    _add_worker(wk)
    add_metrics_port(wk)

    pl = sub.add_parser("planner", help="the planner, or `planner use POLICY` to swap its policy")
    _add_redis(pl, "redis://127.0.0.1:6379/0")
    _add_planner(pl)
    add_metrics_port(pl)
    pl_sub = pl.add_subparsers(dest="planner_command", parser_class=_Parser)
    use = pl_sub.add_parser("use", help="swap the running planner's policy")
    use.add_argument("policy")
    use.add_argument("--set", dest="use_set", action="append", metavar="KEY=VALUE", help="policy parameter")

    sm = sub.add_parser("submit", help="stream a completion from a running gateway")
    sm.add_argument("prompt")
    sm.add_argument("--url", default=env("URL", "http://127.0.0.1:8000"), help="gateway (NIGHTJAR_URL)")
    sm.add_argument("--max-tokens", type=int, default=64)
    sm.add_argument("--temperature", type=float, default=0.0)
    sm.add_argument("--seed", type=int, default=None)
    sm.add_argument("--chat", action="store_true", help="send the prompt as a chat message")
    sm.add_argument("--api-key", default=env("API_KEY"), help="Bearer key for the gateway (NIGHTJAR_API_KEY)")

    sub.add_parser("models", help="build, convert and train the bundled models (training.cli)")
    sub.add_parser("bench", help="benchmark every policy under dynamic load (benchmarks.load)")
    sub.add_parser("top", help="a live view of a running deployment from its Redis (nightjar.top)")
    sub.add_parser("chat", help="chat with a running gateway, tokens coloured by their maker (nightjar.chat)")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in _DELEGATED:
        return _delegate(argv[0], argv[1:])
    args = build_parser().parse_args(argv)
    from shared import logs

    logs.configure(str(args.log_level), args.log_format)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is noise here
    from nightjar import commands

    try:
        return int(commands.run(args) or 0)
    except UsageError as exc:
        print(f"nightjar: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


# Subcommands whose arguments another package parses: name -> module with main(argv) -> int.
_DELEGATED = {
    "models": "training.cli",
    "bench": "benchmarks.load.cli",
    "top": "nightjar.top",
    "chat": "nightjar.chat",
}


def _delegate(command: str, argv: list[str]) -> int:
    import importlib

    try:
        module = importlib.import_module(_DELEGATED[command])
    except ImportError as exc:
        print(f"nightjar: error: the {command} command is not available: {exc}", file=sys.stderr)
        return 2
    return int(module.main(argv) or 0)
