"""API keys and per-key request rates for every /v1 route and the chat page's /ui/api (an
ASGI middleware).

With keys configured (``GatewaySettings.api_keys``: ``--api-key``, ``NIGHTJAR_API_KEYS``)
each /v1 request needs ``Authorization: Bearer <key>`` (else 401 ``unauthorized``). The
request's owner — the first 32 hex digits of the key's SHA-256, never the key — is put in
``scope["state"]["owner"]``; jobs record it and only their owner sees them. With no key the
gateway is open (owner ""), and says so in a warning at start. ``/health*`` and ``/admin``
(its own token) are not guarded here.

With keys configured, ``metrics_require_key`` guards ``/metrics`` too (off by default: a
Prometheus scraper usually has no key) and ``docs_require_key`` guards ``/docs``, ``/redoc``
and ``/openapi.json`` (on by default: the schema lists every route). A client address that
failed authentication ``auth_failures_per_min`` times within the last minute gets a 429
``rate_limited`` with ``Retry-After`` for every guarded request — a right key included, so
the 429 tells a key guesser nothing — until its oldest failure is a minute old.

The rate limit is a token bucket per owner (per client address when open), in this process:
``rate_limit_rps`` tokens a second, ``rate_limit_burst`` at most; an empty bucket is a 429
``rate_limited`` with ``Retry-After``.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections import OrderedDict, deque

from fastapi import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.errors import APIError, send_error
from gateway.settings import GatewaySettings
from shared.errors import ErrorCode

GUARDED_PREFIXES = ("/v1", "/ui/api")  # the API, and the chat page's data (its files stay open)
METRICS_PATHS = ("/metrics",)
DOCS_PATHS = ("/docs", "/redoc", "/openapi.json")
MAX_BUCKETS = 100_000  # identities remembered; the least recently seen are forgotten first
FAILURE_WINDOW_S = 60.0


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


class FailedAuth:
    """Failed authentications per client address over the last ``FAILURE_WINDOW_S``."""

    def __init__(self, per_window: int) -> None:
        self.per_window = per_window
        self._seen: OrderedDict[str, deque[float]] = OrderedDict()

    def wait(self, addr: str, now: float | None = None) -> float:
        """Seconds until ``addr`` may try again (0: now)."""
        got = self._seen.get(addr)
        if got is None or len(got) < self.per_window:
            return 0.0
        now = time.monotonic() if now is None else now
        return max(0.0, got[0] + FAILURE_WINDOW_S - now)

    def fail(self, addr: str, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        got = self._seen.pop(addr, None) or deque(maxlen=self.per_window)
        got.append(now)
        self._seen[addr] = got
        if len(self._seen) > MAX_BUCKETS:
            self._seen.popitem(last=False)


class Guard:
    """Authenticate and rate-limit /v1 requests before their body is read."""

    def __init__(self, app: ASGIApp, settings: GatewaySettings) -> None:
        self.app = app
        self._owners = {owner_of(k) for k in settings.api_keys if k}
        self._prefixes: tuple[str, ...] = GUARDED_PREFIXES
        if self._owners:
            self._prefixes += METRICS_PATHS if settings.metrics_require_key else ()
            self._prefixes += DOCS_PATHS if settings.docs_require_key else ()
        per_min = settings.auth_failures_per_min
        self._failures = FailedAuth(per_min) if per_min > 0 else None
        self._buckets = (
            TokenBuckets(settings.rate_limit_rps, settings.rate_limit_burst)
            if settings.rate_limit_rps > 0
            else None
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = str(scope.get("path", ""))
        guarded = any(path == p or path.startswith(p + "/") for p in self._prefixes)
        if scope["type"] != "http" or not guarded:
            await self.app(scope, receive, send)
            return
        who = ""
        client = scope.get("client")
        addr = client[0] if client else "?"
        if self._owners:
            if self._failures is not None and (wait := self._failures.wait(addr)) > 0:
                err = APIError.of(
                    ErrorCode.RATE_LIMITED,
                    f"too many failed authentication attempts from this address; retry in {wait:.0f}s",
                    retry_after=max(1, math.ceil(wait)),
                )
                await send_error(send, err)
                return
            key = _bearer(scope)
            who = owner_of(key) if key else ""
            if who not in self._owners:
                if self._failures is not None:
                    self._failures.fail(addr)
                err = APIError.of(
                    ErrorCode.UNAUTHORIZED,
                    "Incorrect or missing API key: send 'Authorization: Bearer <key>'",
                )
                await send_error(send, err)
                return
        if self._buckets is not None:
            ident = who or f"addr:{addr}"
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
