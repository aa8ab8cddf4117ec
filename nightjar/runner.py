"""Running services in one process until a signal: the gateway under uvicorn, the others
as plain coroutines, all in one anyio task group, on uvloop where it is installed (as vLLM
and SGLang run; ``NIGHTJAR_UVLOOP=0`` for the standard asyncio loop)."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import signal
from collections.abc import Callable, Coroutine, Generator
from typing import Any

import anyio
import uvicorn

log = logging.getLogger("nightjar")

Service = Callable[[], Coroutine[Any, Any, Any]]
Stop = Callable[[], None]  # asks a service to finish its work and return


class _Server(uvicorn.Server):
    """uvicorn without its own signal handlers: the runner owns SIGINT/SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def http_server(app: Any, host: str, port: int, log_level: str = "info") -> _Server:
    """uvicorn for ``app`` with the gateway's timeouts and limits (``nightjar.http_config``)."""
    from nightjar.http_config import config

    return _Server(config(app, host, port, log_level))


def use_uvloop() -> bool:
    """Whether services run on uvloop: installed, and not turned off. Measured on the 2-core
    VM (docs/benchmarks/history, 2026-12-02): served tokens/s at 32 users 0.64 -> 0.69 of the engine
    alone on Redis, 0.48 -> 0.54 under ``nightjar up`` (two runs each, in turns; noisy)."""
    from shared.settings import RuntimeSettings

    return RuntimeSettings().uvloop and importlib.util.find_spec("uvloop") is not None


def serve(
    services: list[Service],
    server: uvicorn.Server | None = None,
    drainers: list[tuple[Service, Stop]] | None = None,
) -> None:
    """``run_services`` on a new event loop (uvloop where ``use_uvloop``)."""
    anyio.run(run_services, services, server, drainers, backend_options={"use_uvloop": use_uvloop()})


async def run_services(
    services: list[Service],
    server: uvicorn.Server | None = None,
    drainers: list[tuple[Service, Stop]] | None = None,
) -> None:
    """Run until SIGINT/SIGTERM (or until the HTTP server stops); a crash of any service
    stops them all and propagates.

    ``drainers`` are services with a stop hook (a worker: no new jobs, running ones finish
    or are handed back, then it returns). On the first signal the HTTP server finishes open
    responses and every drainer is asked to stop; the run ends once they all returned (the
    other services are then cancelled). A second signal ends it at once.
    """
    drainers = drainers or []
    draining = False
    async with anyio.create_task_group() as tg:

        async def stop_on_signal() -> None:
            nonlocal draining
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for sig in signals:
                    name = signal.Signals(sig).name
                    if draining or not (drainers or server is not None):
                        log.info("stopping now on %s", name)
                        tg.cancel_scope.cancel()
                        return
                    log.info("draining on %s (send it again to stop at once)", name)
                    draining = True
                    if server is not None:
                        server.should_exit = True  # graceful: finish open responses first
                    for _, stop in drainers:
                        stop()

        async def serve_until_drained() -> None:
            async with anyio.create_task_group() as inner:
                for run, _ in drainers:
                    inner.start_soon(run)
                if server is not None:
                    await server.serve()
                    if not draining:  # the server stopped by itself (e.g. its port was taken)
                        inner.cancel_scope.cancel()
            tg.cancel_scope.cancel()

        tg.start_soon(stop_on_signal)
        for service in services:
            tg.start_soon(service)
        if drainers or server is not None:
            tg.start_soon(serve_until_drained)
