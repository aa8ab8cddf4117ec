"""What each ``nightjar`` subcommand does (the parser lives in ``nightjar.cli``)."""

from __future__ import annotations

import argparse
import logging
from typing import Any

import anyio

from nightjar.options import UsageError, api_keys, drafter_dirs, engine_options, model_dir, pairs
from nightjar.runner import Service, Stop, http_server, serve

log = logging.getLogger("nightjar")


def run(args: argparse.Namespace) -> int:
    handler = {
        "up": _up,
        "gateway": _gateway,
        "worker": _worker,
        "planner": _planner,
        "submit": _submit,
    }[args.command]
    return handler(args)


def _settle_heap() -> None:
    """Collect once and freeze what is left: the modules, the model and the engine built at
    start are never scanned again, so a full collection no longer walks ~360k objects (about
    190 ms on this CPU, 7-9 times in a 2-minute serving benchmark) in the middle of serving.
    Call it just before serving, once everything long-lived exists (SGLang and vLLM do the
    same after start-up). Only a process of its own: frozen garbage cycles are never freed."""
    import gc

    gc.collect()
    gc.freeze()


def _gateway_app(args: argparse.Namespace) -> Any:
    import os

    from gateway.app import create_app
    from gateway.settings import GatewaySettings

    for name in ("max_queue", "max_body_bytes", "max_concurrency"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("request_timeout", "result_ttl"):
        if not getattr(args, name) > 0:
            raise UsageError(f"--{name.replace('_', '-')} must be positive")
    if args.rate_limit < 0 or args.rate_burst < 0:
        raise UsageError("--rate-limit and --rate-burst must not be negative")
    if not args.outage_grace >= 0:
        raise UsageError("--outage-grace must not be negative")
    settings = GatewaySettings(
        redis_url=args.redis_url,
        max_queue=args.max_queue,
        webhook_secret=getattr(args, "webhook_secret", None) or None,
        admin_token=os.environ.get("NIGHTJAR_ADMIN_TOKEN") or None,
        api_keys=api_keys(args.api_key),
        rate_limit_rps=args.rate_limit,
        rate_limit_burst=args.rate_burst,
        request_timeout_s=args.request_timeout,
        outage_grace_s=args.outage_grace,
        result_ttl_s=args.result_ttl,
        max_body_bytes=args.max_body_bytes,
        max_concurrency=args.max_concurrency,
    )
    return create_app(settings)


def _worker_service(args: argparse.Namespace) -> tuple[Service, Stop]:
    from worker.profiling import ProfileSettings
    from worker.service import WorkerService
    from worker.settings import WorkerSettings, default_worker_id

    model = model_dir(args.model)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    try:
        settings = WorkerSettings(
            model_dir=model,
            redis_url=args.redis_url,
            worker_id=args.worker_id or default_worker_id(),
            model_name=getattr(args, "served_model_name", "") or "",
            max_jobs=args.max_jobs,
            claim_idle_s=args.claim_idle,
            max_deliveries=args.max_deliveries,
            progress_s=args.progress_interval,
            drain_timeout_s=args.drain_timeout,
            result_ttl_s=args.result_ttl,
            engine=engine_options(args.engine_opt),
            drafters=drafter_dirs(model, args.drafter),
            ngram=args.ngram,
            metrics_port=getattr(args, "metrics_port", None),
            metrics_host=getattr(args, "metrics_host", "127.0.0.1"),
            profile=ProfileSettings(
                enabled=args.profile, budget_s=args.profile_budget, reps=args.profile_reps
            ),
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        worker = WorkerService(settings)
        return worker.run, worker.request_stop
    except TypeError as exc:  # an engine option the engine does not take
        raise UsageError(f"bad --engine-opt: {exc}") from None
    except ValueError as exc:  # e.g. a drafter whose vocabulary is not the target's
        raise UsageError(str(exc)) from None


def _planner_service(args: argparse.Namespace) -> Service:
    from planner.policies import registry
    from planner.service import PlannerService
    from planner.settings import PlannerSettings

    params = pairs(args.set, "--set")
    try:
        registry.create(args.policy, **params)  # fail fast, before any service starts
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not args.valid_for > 0:
        raise UsageError("--valid-for must be positive")
    settings = PlannerSettings(
        redis_url=args.redis_url,
        policy=args.policy,
        params=params,
        valid_for_s=args.valid_for,
        republish_s=min(10.0, args.valid_for / 3),
        metrics_port=getattr(args, "metrics_port", None),
        metrics_host=getattr(args, "metrics_host", "127.0.0.1"),
    )
    return PlannerService(settings).run


def _up(args: argparse.Namespace) -> int:
    planner = _planner_service(args)
    worker = _worker_service(args)
    server = http_server(_gateway_app(args), args.host, args.port, args.log_level)
    log.info("nightjar up: gateway at http://%s:%d, Redis %s", args.host, args.port, args.redis_url)
    _settle_heap()
    serve([planner], server, [worker])
    return 0


def _gateway(args: argparse.Namespace) -> int:
    server = http_server(_gateway_app(args), args.host, args.port, args.log_level)
    _settle_heap()
    serve([], server)
    return 0


def _worker(args: argparse.Namespace) -> int:
    worker = _worker_service(args)
    _settle_heap()
    serve([], None, [worker])
    return 0


def _planner(args: argparse.Namespace) -> int:
    if args.planner_command == "use":
        return _planner_use(args)
    planner = _planner_service(args)
    _settle_heap()
    serve([planner])
    return 0


def _planner_use(args: argparse.Namespace) -> int:
    from planner.policies import registry
    from shared import codec, keys
    from shared.connection import connect
    from shared.control import PolicyCommand

    params = pairs(args.use_set, "--set")
    try:
        registry.create(args.policy, **params)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    cmd = PolicyCommand(policy=args.policy, params=params, requested_by="cli")

    async def send() -> None:
        r = connect(args.redis_url)
        try:
            await r.xadd(
                keys.PLANNER_CONTROL_STREAM,
                codec.entry(cmd),
                maxlen=keys.PLANNER_CONTROL_MAXLEN,
                approximate=True,
            )
        finally:
            await r.aclose()

    anyio.run(send)
    print(f"asked the planner to use {args.policy} {params or ''}".rstrip())
    return 0


def _submit(args: argparse.Namespace) -> int:
    from nightjar.submit import stream_completion

    body: dict[str, Any] = {"max_tokens": args.max_tokens, "temperature": args.temperature}
    if args.seed is not None:
        body["seed"] = args.seed
    if args.chat:
        body["messages"] = [{"role": "user", "content": args.prompt}]
    else:
        body["prompt"] = args.prompt
    return stream_completion(args.url, body, args.chat, api_key=args.api_key)
