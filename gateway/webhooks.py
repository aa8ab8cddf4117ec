"""Webhooks: a callback URL per job or batch, signed, retried, delivered at least once.

A submit with ``webhook_url`` (job API, ``POST /v1/batches``) records a delivery in Redis
(``keys.webhook(...)``, due in the sorted set ``keys.WEBHOOKS``). The delivery loop runs in
every gateway process (``Deliverer.run``, started with the app): it claims due deliveries
with one Lua script (their due time moves ``CLAIM_S`` ahead, so two gateways never send the
same attempt at once and a gateway that dies mid-send leaves it to another), and for each
whose job or batch is over POSTs the event. A 2xx ends the delivery; anything else (or no
answer within ``TIMEOUT_S``) is retried with exponential backoff (1 s, 2 s, … ``MAX_BACKOFF_S``)
up to ``webhook_max_attempts``. At least once: a receiver may see an event twice (same
``webhook-id``) and should deduplicate on it.

Signature (``--webhook-secret``): ``Webhook-Signature: t=<unix time>,v1=<hex HMAC-SHA256 of
"<t>.<body>">``; without a secret, events are sent unsigned.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import httpx
from redis.exceptions import RedisError

from gateway.errors import APIError
from gateway.store import JobStore
from shared import jobs, keys
from shared.errors import ErrorCode

log = logging.getLogger("nightjar.gateway")
CLAIM_S = 30.0  # a claimed delivery is this gateway's for this long
TIMEOUT_S = 10.0
MAX_BACKOFF_S = 300.0
POLL_S = 0.5  # how often due deliveries are looked for
NOT_OVER_S = 1.0  # a job not over yet is looked at again this much later
BATCH = 32

# KEYS: the due set. ARGV: now, claim-until, count. Due members, their due time moved on.
CLAIM_LUA = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
for _, m in ipairs(due) do redis.call('ZADD', KEYS[1], ARGV[2], m) end
return due
"""


def check_url(url: str | None) -> str | None:
    if url is None:
        return None
    parsed = httpx.URL(url) if url.startswith(("http://", "https://")) else None
    if parsed is None or not parsed.host or len(url) > 2048:
        raise APIError.of(ErrorCode.BAD_REQUEST, "webhook_url must be an http(s) URL", param="webhook_url")
    return url


def sign(secret: str, body: bytes, ts: int) -> str:
    mac = hmac.new(secret.encode(), f"{ts}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={ts},v1={mac}"


def verify(secret: str, body: bytes, header: str, tolerance_s: float = 300.0) -> bool:
    """What a receiver checks (the tests use it too)."""
    fields = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    try:
        ts = int(fields["t"])
    except (KeyError, ValueError):
        return False
    if abs(time.time() - ts) > tolerance_s:
        return False
    return hmac.compare_digest(sign(secret, body, ts), header)


async def register(store: JobStore, kind: str, ident: str, url: str, owner: str) -> None:
    """Deliver ``kind`` (job / batch) ``ident``'s final event to ``url`` once it is over."""
    ttl = max(1, int(store.settings.result_ttl_s))
    member = f"{kind}:{ident}"
    async with store.r.pipeline(transaction=False) as pipe:
        pipe.hset(keys.webhook(member), mapping={"url": url, "owner": owner, "attempts": 0})
        pipe.expire(keys.webhook(member), ttl)
        pipe.zadd(keys.WEBHOOKS, {member: time.time()})
        await pipe.execute()


Post = Callable[[str, bytes, dict[str, str]], Awaitable[int]]


class Deliverer:
    def __init__(self, store: JobStore, post: Post | None = None) -> None:
        self.store = store
        self.settings = store.settings
        self._claim = store.r.register_script(CLAIM_LUA)
        self._post = post or self._http_post
        self._client: httpx.AsyncClient | None = None

    async def _http_post(self, url: str, body: bytes, headers: dict[str, str]) -> int:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=TIMEOUT_S, follow_redirects=False)
        resp = await self._client.post(url, content=body, headers=headers)
        return resp.status_code

    async def run(self) -> None:
        """Deliver until cancelled; a Redis outage only pauses it."""
        try:
            while True:
                try:
                    if not await self.once():
                        await anyio.sleep(POLL_S)
                except (RedisError, OSError) as exc:
                    log.warning("webhook delivery: %s: %s (retrying)", type(exc).__name__, exc)
                    await anyio.sleep(2.0)
        finally:
            if self._client is not None:
                await self._client.aclose()

    async def once(self) -> int:
        """One round: claim due deliveries and attempt each; how many were claimed."""
        now = time.time()
        due = await self._claim(keys=[keys.WEBHOOKS], args=[now, now + CLAIM_S, BATCH])
        for raw in due or []:
            await self._attempt(raw.decode() if isinstance(raw, bytes) else str(raw))
        return len(due or [])

    async def _attempt(self, member: str) -> None:
        fields = {
            (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
            for k, v in (await self.store.r.hgetall(keys.webhook(member))).items()
        }
        if not fields:
            await self.store.r.zrem(keys.WEBHOOKS, member)  # expired
            return
        kind, _, ident = member.partition(":")
        event = await self._event(kind, ident, fields["owner"])
        if event is None:  # not over yet
            await self.store.r.zadd(keys.WEBHOOKS, {member: time.time() + NOT_OVER_S})
            return
        body = json.dumps(event, separators=(",", ":")).encode()
        headers = {
            "content-type": "application/json",
            "webhook-id": member,
            "user-agent": "nightjar-webhooks",
        }
        if self.settings.webhook_secret:
            headers["webhook-signature"] = sign(self.settings.webhook_secret, body, int(time.time()))
        try:
            status = await self._post(fields["url"], body, headers)
        except (httpx.HTTPError, OSError) as exc:
            status, why = 0, f"{type(exc).__name__}: {exc}"
        else:
            why = f"HTTP {status}"
        if 200 <= status < 300:
            async with self.store.r.pipeline(transaction=False) as pipe:
                pipe.zrem(keys.WEBHOOKS, member)
                pipe.delete(keys.webhook(member))
                await pipe.execute()
            return
        attempts = int(await self.store.r.hincrby(keys.webhook(member), "attempts", 1))
        if attempts >= self.settings.webhook_max_attempts:
            log.error("webhook %s to %s dropped after %d attempts (%s)", member, fields["url"], attempts, why)
            async with self.store.r.pipeline(transaction=False) as pipe:
                pipe.zrem(keys.WEBHOOKS, member)
                pipe.delete(keys.webhook(member))
                await pipe.execute()
            return
        backoff = min(MAX_BACKOFF_S, 2.0 ** (attempts - 1))
        log.warning("webhook %s attempt %d failed (%s); retrying in %.0fs", member, attempts, why, backoff)
        await self.store.r.zadd(keys.WEBHOOKS, {member: time.time() + backoff})

    async def _event(self, kind: str, ident: str, owner: str) -> dict[str, Any] | None:
        """The event to send, or None while the job or batch is not over."""
        if kind == "batch":
            from gateway import batches  # batches imports nothing of this module

            try:
                batch = await batches.view(self.store, owner, ident)
            except APIError:
                return {"type": "batch.expired", "data": {"id": ident}, "created_at": int(time.time())}
            if batch["status"] not in ("completed", "cancelled", "failed", "expired"):
                return None
            return {"type": f"batch.{batch['status']}", "data": batch, "created_at": int(time.time())}
        try:
            info = await self.store.info(ident, owner)
        except APIError:
            return {"type": "job.expired", "data": {"id": ident}, "created_at": int(time.time())}
        if jobs.status_of(info["status"]) not in jobs.TERMINAL:
            return None
        return {"type": f"job.{info['status']}", "data": info, "created_at": int(time.time())}
