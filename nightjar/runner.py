"""Running services in one process until a signal: the gateway under uvicorn, the others
as plain coroutines, all in one anyio task group."""

from __future__ import annotations

import contextlib
import logging
import signal
from collections.abc import Callable, Coroutine, Generator
from typing import Any

import anyio
import uvicorn

log = logging.getLogger("nightjar")

Service = Callable[[], Coroutine[Any, Any, Any]]


class _Server(uvicorn.Server):
    """uvicorn without its own signal handlers: the runner owns SIGINT/SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def http_server(app: Any, host: str, port: int, log_level: str = "info") -> _Server:
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on")
    return _Server(config)


async def run_services(services: list[Service], server: uvicorn.Server | None = None) -> None:
    """Run until SIGINT/SIGTERM (or until the HTTP server stops); a crash of any service
    stops them all and propagates."""
    async with anyio.create_task_group() as tg:

        async def stop_on_signal() -> None:
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for sig in signals:
                    log.info("stopping on %s", signal.Signals(sig).name)
                    if server is not None:
                        server.should_exit = True  # graceful: finish open responses first
                    else:
                        tg.cancel_scope.cancel()
                    return

        tg.start_soon(stop_on_signal)
        for service in services:
            tg.start_soon(service)
        if server is not None:
            await server.serve()
            tg.cancel_scope.cancel()
