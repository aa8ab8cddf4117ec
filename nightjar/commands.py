"""What each ``nightjar`` subcommand does (the parser lives in ``nightjar.cli``)."""

from __future__ import annotations

import argparse
import logging
from typing import TYPE_CHECKING, Any

import anyio

from nightjar import flags
from nightjar.default_model import default_model
from nightjar.options import UsageError, api_keys, drafter_dirs, engine_options, model_dir, pairs, with_dtype
from nightjar.ready import announce_ready, server_url
from nightjar.runner import Service, Stop, http_server, serve
from nightjar.settings import SubmitSettings, UpSettings, gateway_settings, planner_settings, worker_settings
from planner.settings import PlannerSettings

if TYPE_CHECKING:
    from gateway.settings import GatewaySettings
    from worker.settings import WorkerSettings

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


def gateway_config(args: argparse.Namespace, standalone: bool) -> GatewaySettings:
    """The gateway's settings: the flags given, the environment, the defaults."""
    cls = gateway_settings(standalone)
    values = flags.given(args, cls)
    if "api_keys" in values:  # --api-key, repeatable
        values["api_keys"] = api_keys(values["api_keys"])
    settings: GatewaySettings = flags.build(cls, **values)
    return settings


def worker_config(args: argparse.Namespace, standalone: bool, export: bool = False) -> WorkerSettings:
    """The worker's settings, its model and drafters resolved (``nightjar.default_model``
    when none is named: exported first when ``export``)."""
    cls = worker_settings(standalone)
    values = flags.given(args, cls)
    if "engine" in values:  # --engine-opt KEY=VALUE, repeatable
        values["engine"] = engine_options(values["engine"])
    settings: WorkerSettings = flags.build(cls, **values)
    model = model_dir(settings.model_dir) if settings.model_dir else str(default_model(export))
    drafters = drafter_dirs(model, list(settings.drafters) if settings.drafters is not None else None)
    engine = with_dtype(settings.engine, settings.dtype)
    return settings.model_copy(update={"model_dir": model, "drafters": tuple(drafters), "engine": engine})


def planner_config(args: argparse.Namespace, standalone: bool) -> PlannerSettings:
    """The planner's settings; its policy and parameters checked before anything starts."""
    from planner.policies import registry

    cls = planner_settings(standalone)
    values = flags.given(args, cls)
    if "params" in values:  # --set KEY=VALUE, repeatable
        values["params"] = pairs(values["params"], "--set")
    settings: PlannerSettings = flags.build(cls, **values)
    try:
        registry.create(settings.policy, **settings.params)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not standalone:
        port = up_planner_metrics_port(settings.metrics_port)
        settings = settings.model_copy(update={"metrics_port": port})
    return settings


def up_planner_metrics_port(port: int | None) -> int | None:
    """The planner's /metrics port under ``nightjar up``, where the worker and the planner
    read the same NIGHTJAR_METRICS_PORT: the worker keeps it, the planner takes the next
    one (0, any free port, stays 0; past 65535: none), so they never both bind one port."""
    if not port:
        return port
    return port + 1 if port < 65535 else None


def _gateway_app(args: argparse.Namespace, standalone: bool) -> Any:
    from gateway.app import create_app

    return create_app(gateway_config(args, standalone))


def _worker_service(args: argparse.Namespace, standalone: bool, export: bool) -> tuple[Service, Stop]:
    from worker.service import WorkerService

    settings = worker_config(args, standalone, export)
    if settings.threads:
        import torch

        torch.set_num_threads(settings.threads)
    try:
        worker = WorkerService(settings)
        return worker.run, worker.request_stop
    except TypeError as exc:  # an engine option the engine does not take
        raise UsageError(f"bad --engine-opt: {exc}") from None
    except ValueError as exc:  # e.g. a drafter whose vocabulary is not the target's
        raise UsageError(str(exc)) from None


def _planner_service(args: argparse.Namespace, standalone: bool) -> Service:
    from planner.service import PlannerService

    return PlannerService(planner_config(args, standalone)).run


def _server(app: Any) -> tuple[Any, Service]:
    """The gateway's HTTP server, and the service that prints the ready line (``nightjar.ready``)."""
    s = app.state.settings
    server = http_server(app, s.host, s.port, logging.getLevelName(logging.getLogger().level).lower())

    async def ready() -> None:
        await announce_ready(app.state.store, lambda: server_url(server, s.host, s.port))

    return server, ready


def _up(args: argparse.Namespace) -> int:
    up = flags.build(UpSettings, **flags.given(args, UpSettings))
    planner = _planner_service(args, standalone=False)
    app = _gateway_app(args, standalone=False)
    worker = _worker_service(args, standalone=False, export=True)
    server, ready = _server(app)
    s = app.state.settings
    store = None
    if up.share_store and s.redis_url.startswith("memory://"):
        from nightjar.store_server import StoreServer

        try:
            store = StoreServer(f"http://{s.host}:{s.port}", up.store_port)
        except OSError as exc:
            raise UsageError(f"--store-port {up.store_port}: {exc}") from None
    log.info(
        "nightjar up: gateway at http://%s:%d, Redis %s", s.host, s.port, store.url if store else s.redis_url
    )
    _settle_heap()
    try:
        serve([planner, ready], server, [worker])
    finally:
        if store is not None:
            store.close()
    return 0


def _gateway(args: argparse.Namespace) -> int:
    server, ready = _server(_gateway_app(args, standalone=True))
    _settle_heap()
    serve([ready], server)
    return 0


def _worker(args: argparse.Namespace) -> int:
    worker = _worker_service(args, standalone=True, export=False)
    _settle_heap()
    serve([], None, [worker])
    return 0


def _planner(args: argparse.Namespace) -> int:
    if getattr(args, "planner_command", None) == "use":
        return _planner_use(args)
    planner = _planner_service(args, standalone=True)
    _settle_heap()
    serve([planner])
    return 0


def _planner_use(args: argparse.Namespace) -> int:
    from planner.policies import registry
    from shared import codec, keys
    from shared.connection import connect
    from shared.control import PolicyCommand

    redis_url = flags.build(planner_settings(True), **flags.given(args, PlannerSettings)).redis_url
    params = pairs(args.use_set, "--set")
    try:
        registry.create(args.policy, **params)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    cmd = PolicyCommand(policy=args.policy, params=params, requested_by="cli")

    async def send() -> None:
        r = connect(redis_url)
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

    s = flags.build(SubmitSettings, **flags.given(args, SubmitSettings))
    body: dict[str, Any] = {"max_tokens": s.max_tokens, "temperature": s.temperature}
    if s.seed is not None:
        body["seed"] = s.seed
    if s.chat:
        body["messages"] = [{"role": "user", "content": args.prompt}]
    else:
        body["prompt"] = args.prompt
    return stream_completion(s.url, body, s.chat, api_key=s.api_key)
