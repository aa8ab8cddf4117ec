"""API keys and per-key request rates for every /v1 route and the chat page's /ui/api (an
ASGI middleware).

With keys configured (``GatewaySettings.api_keys``: ``--api-key``, ``NIGHTJAR_API_KEYS``)
each /v1 request needs ``Authorization: Bearer <key>`` (else 401 ``unauthorized``). The
request's owner — the first 32 hex digits of the key's SHA-256, never the key — is put in
``scope["state"]["owner"]``; jobs record it and only their owner sees them. With no key the
gateway is open (owner ""), and says so in a warning at start. ``/health*`` and ``/admin``
(its own token) are not guarded here.

The rate limit is a token bucket per owner (per client address when open), in this process:
``rate_limit_rps`` tokens a second, ``rate_limit_burst`` at most; an empty bucket is a 429
``rate_limited`` with ``Retry-After``.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections import OrderedDict

from fastapi import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.errors import APIError, send_error
from gateway.settings import GatewaySettings
from shared.errors import ErrorCode

GUARDED_PREFIXES = ("/v1", "/ui/api")  # the API, and the chat page's data (its files stay open)
MAX_BUCKETS = 100_000  # identities remembered; the least recently seen are forgotten first


def owner_of(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()[:32]


def owner(request: Request) -> str:
    """The owner of this request ("" when the gateway is open)."""
    return str(request.scope.get("state", {}).get("owner", ""))


class TokenBuckets:
    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = float(burst or max(1, math.ceil(rate)))
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def take(self, ident: str, now: float | None = None) -> float:
        """Take a token for ``ident``: 0 when granted, else the seconds until one is there."""
        now = time.monotonic() if now is None else now
        tokens, at = self._buckets.pop(ident, (self.burst, now))
        tokens = min(self.burst, tokens + (now - at) * self.rate)
        wait = 0.0
        if tokens >= 1.0:
            tokens -= 1.0
        else:
            wait = (1.0 - tokens) / self.rate
        self._buckets[ident] = (tokens, now)
        if len(self._buckets) > MAX_BUCKETS:
            self._buckets.popitem(last=False)
        return wait


class Guard:
    """Authenticate and rate-limit /v1 requests before their body is read."""

    def __init__(self, app: ASGIApp, settings: GatewaySettings) -> None:
        self.app = app
        self._owners = {owner_of(k) for k in settings.api_keys if k}
        self._buckets = (
            TokenBuckets(settings.rate_limit_rps, settings.rate_limit_burst)
            if settings.rate_limit_rps > 0
            else None
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = str(scope.get("path", ""))
        guarded = any(path == p or path.startswith(p + "/") for p in GUARDED_PREFIXES)
        if scope["type"] != "http" or not guarded:
            await self.app(scope, receive, send)
            return
        who = ""
        if self._owners:
            key = _bearer(scope)
            who = owner_of(key) if key else ""
            if who not in self._owners:
                err = APIError.of(
                    ErrorCode.UNAUTHORIZED,
                    "Incorrect or missing API key: send 'Authorization: Bearer <key>'",
                )
                await send_error(send, err)
                return
        if self._buckets is not None:
            client = scope.get("client")
            ident = who or (f"addr:{client[0]}" if client else "addr:?")
            wait = self._buckets.take(ident)
            if wait > 0:
                err = APIError.of(
                    ErrorCode.RATE_LIMITED,
                    f"rate limit reached: {self._buckets.rate:g} requests/s; retry in {wait:.2f}s",
                    retry_after=max(1, math.ceil(wait)),
                )
                await send_error(send, err)
                return
        scope.setdefault("state", {})["owner"] = who
        await self.app(scope, receive, send)


def _bearer(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            text = value.decode("latin-1")
            scheme, _, token = text.partition(" ")
            return token.strip() if scheme.lower() == "bearer" and token.strip() else None
    return None
