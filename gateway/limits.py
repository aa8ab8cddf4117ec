"""HTTP hygiene as one ASGI middleware: requests in flight, body size, body and send deadlines.

- more than ``max_concurrency`` requests in flight: 503 ``unavailable`` with Retry-After;
- a body over ``max_body_bytes`` (by Content-Length, or counted as it arrives): 413
  ``payload_too_large``; the rest of the body is read and dropped first (up to
  ``DISCARD_FACTOR`` × the limit, for ``DISCARD_S`` at most), since a server that answers and
  closes while a client still uploads makes the kernel reset the connection, and the client
  then never sees the answer;
- a body not complete within ``body_timeout_s`` of the request's start (a slow-loris body):
  408 ``timeout``;
- a response ``send`` that cannot complete within ``send_timeout_s`` (a client that reads
  nothing while its socket buffer is full): the request is abandoned and the connection
  dropped; a streamed job is cancelled by its route as for any client that leaves.

The body is read here in full (it is bounded) and replayed to the app; later ``receive``
calls go to the server, so routes still see ``http.disconnect``.
"""

from __future__ import annotations

import logging

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import APIError, send_error
from gateway.settings import GatewaySettings
from shared.errors import ErrorCode

log = logging.getLogger("nightjar.gateway")


CLOSE = {"Connection": "close"}  # the rest of an unread body must not be taken for a next request
DISCARD_FACTOR = 8  # a refused body is read and dropped up to this many times the limit
DISCARD_S = 2.0  # and for this long at most


class ClientTooSlow(Exception):
    """A response could not be sent within the send deadline."""


class Limits:
    def __init__(self, app: ASGIApp, settings: GatewaySettings) -> None:
        self.app = app
        self.s = settings
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.s.max_concurrency:
            await send_error(
                send, APIError.of(ErrorCode.UNAVAILABLE, "too many requests in flight; retry shortly")
            )
            return
        self.in_flight += 1
        try:
            await self._serve(scope, receive, send)
        finally:
            self.in_flight -= 1

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        limit = self.s.max_body_bytes
        declared = _content_length(scope)
        if declared is not None and declared < 0:
            await send_error(send, APIError.of(ErrorCode.BAD_REQUEST, "invalid Content-Length"))
            return
        if declared is not None and declared > limit:
            await _discard(receive, limit * DISCARD_FACTOR)
            await send_error(send, _too_large(limit), CLOSE)
            return
        chunks: list[bytes] = []
        size = 0
        with anyio.move_on_after(self.s.body_timeout_s) as scope_timer:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return  # the client left before its body was complete: nobody to answer
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    if message.get("more_body", False):
                        await _discard(receive, limit * DISCARD_FACTOR - size)
                    await send_error(send, _too_large(limit), CLOSE)
                    return
                chunks.append(chunk)
                if not message.get("more_body", False):
                    break
        if scope_timer.cancelled_caught:
            await send_error(
                send,
                APIError(
                    408,
                    f"request body not received within {self.s.body_timeout_s:g}s",
                    code=ErrorCode.TIMEOUT,
                ),
                CLOSE,
            )
            return
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        timeout = self.s.send_timeout_s

        async def bounded_send(message: Message) -> None:
            with anyio.move_on_after(timeout) as t:
                await send(message)
            if t.cancelled_caught:
                raise ClientTooSlow(f"client read nothing for {timeout:g}s")

        try:
            await self.app(scope, replay, bounded_send)
        except Exception as exc:
            if not _is_slow(exc):
                raise
            client = scope.get("client")
            log.info("dropped a client that stopped reading (%s): %s", client, exc)


async def _discard(receive: Receive, cap_bytes: int) -> None:
    """Read and drop the rest of a refused body (bounded in bytes and time)."""
    seen = 0
    with anyio.move_on_after(DISCARD_S):
        while seen < cap_bytes:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            seen += len(message.get("body", b""))
            if not message.get("more_body", False):
                return


def _too_large(limit: int) -> APIError:
    mib = limit / (1024 * 1024)
    shown = f"{mib:g} MiB" if mib >= 1 else f"{limit} bytes"
    return APIError.of(ErrorCode.PAYLOAD_TOO_LARGE, f"request body larger than {shown}")


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return -1
    return None


def _is_slow(exc: BaseException) -> bool:
    if isinstance(exc, ClientTooSlow):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return all(_is_slow(e) for e in exc.exceptions)
    return False
