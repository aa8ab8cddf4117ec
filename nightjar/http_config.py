"""uvicorn's configuration for the gateway: timeouts and connection limits.

- ``timeout_keep_alive``: an idle keep-alive connection closes after it;
- a header deadline (``GuardedH11Protocol``): a connection must deliver complete request
  headers within ``header_timeout_s`` of connecting (or of its previous response), else it
  is closed — uvicorn alone waits forever for a slow-loris client's headers;
- ``limit_concurrency``: a backstop above the app's own JSON 503 (``max_concurrency``);
- ``h11_max_incomplete_event_size``: request line + headers larger than 64 KiB are refused;
- ``timeout_graceful_shutdown``: on SIGTERM open responses get ``shutdown_timeout_s`` to end.

Body deadlines, body size and send deadlines are the app's (``gateway.limits``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

MAX_HEADER_BYTES = 64 * 1024
CONCURRENCY_BACKSTOP = 256  # connections above the app's limit before uvicorn's own 503
BACKLOG = 2048


class GuardedH11Protocol(H11Protocol):
    """h11 with a deadline on receiving each request's headers."""

    header_timeout_s: float = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_timer: asyncio.TimerHandle | None = None
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._header_timer is None and (self.cycle is None or self.cycle.response_complete):
            self._arm()  # bytes of a next request on a kept-alive connection
        super().data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        super().connection_lost(exc)

    def _arm(self) -> None:
        waiting_after = self.cycle
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._expire, waiting_after)

    def _expire(self, waiting_after: object) -> None:
        self._header_timer = None
        if self.cycle is waiting_after and not self.transport.is_closing():
            # No new request began since the timer was armed: its headers never completed.
            self.transport.close()


def config(app: Any, host: str, port: int, log_level: str = "info") -> uvicorn.Config:
    """The uvicorn config for ``app``; limits come from its ``state.settings`` (a
    GatewaySettings) when it has one, else the defaults."""
    settings = getattr(getattr(app, "state", None), "settings", None)
    header_timeout_s = float(getattr(settings, "header_timeout_s", 10.0))
    keep_alive_s = float(getattr(settings, "timeout_keep_alive_s", 5.0))
    max_concurrency = int(getattr(settings, "max_concurrency", 8192))
    protocol = type("GuardedH11", (GuardedH11Protocol,), {"header_timeout_s": header_timeout_s})
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        lifespan="on",
        http=protocol,
        timeout_keep_alive=max(1, round(keep_alive_s)),
        limit_concurrency=max_concurrency + CONCURRENCY_BACKSTOP,
        backlog=BACKLOG,
        h11_max_incomplete_event_size=MAX_HEADER_BYTES,
        timeout_graceful_shutdown=max(1, round(float(getattr(settings, "shutdown_timeout_s", 30.0)))),
    )
