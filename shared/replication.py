"""Writes that must outlive a failover wait for a replica to have them (Redis ``WAIT``).

Redis replicates asynchronously: a master that dies may take its last acknowledged writes
with it, and the replica promoted in its place (Sentinel, Cluster) never had them. For a job
the gateway has answered 202 that is a lost job, so before answering the gateway makes sure a
replica holds the admission (and a cancellation): on the connection to the master of each key
it wrote, it writes once more to that key (``EXPIRE`` with its TTL, the same value) and sends
``WAIT replicas timeout`` — a connection's ``WAIT`` covers the replication stream up to its own
last write, which comes after the admission's. One more round trip a submit, to every master
involved at once.

``NIGHTJAR_REDIS_WAIT_REPLICAS`` (default: 1 on ``redis+sentinel://`` and
``redis+cluster://``, where replicas exist by design; 0 — off — elsewhere) and
``NIGHTJAR_REDIS_WAIT_MS`` (default 500). A master whose replicas do not answer in time (a
replica down, or none since a failover) is not waited on for ``BACKOFF_S``: the write stands,
unconfirmed, with a warning, instead of every submit waiting out the timeout.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

log = logging.getLogger(__name__)

REPLICAS_VAR = "NIGHTJAR_REDIS_WAIT_REPLICAS"
TIMEOUT_VAR = "NIGHTJAR_REDIS_WAIT_MS"
DEFAULT_TIMEOUT_MS = 500
BACKOFF_S = 10.0


def wanted_replicas(url: str) -> int:
    """Replicas a write waits for under ``url`` (the variable, else 1 where replicas exist)."""
    given = os.environ.get(REPLICAS_VAR)
    if given is not None and given.strip():
        return max(0, int(given))
    return 1 if url.startswith(("redis+sentinel://", "redis+cluster://", "rediss+cluster://")) else 0


class ReplicaWait:
    """``confirm(keys)``: the writes made so far to ``keys`` (key -> TTL s) are on a replica."""

    def __init__(self, r: aioredis.Redis, replicas: int, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> None:
        self.r = r
        self.replicas = replicas
        self.timeout_ms = timeout_ms
        self.cluster = isinstance(r, RedisCluster)
        self._skip_until: dict[str, float] = {}  # master -> when to wait on it again
        self.confirmed = 0  # writes confirmed on a replica (tests, logs)
        self.unconfirmed = 0

    @classmethod
    def for_url(cls, r: aioredis.Redis, url: str) -> ReplicaWait:
        timeout = int(os.environ.get(TIMEOUT_VAR) or DEFAULT_TIMEOUT_MS)
        return cls(r, wanted_replicas(url), timeout)

    def _master(self, key: str) -> tuple[str, Any]:
        if not self.cluster:
            return "master", None
        node = self.r.get_node_from_key(key)  # type: ignore[attr-defined]
        return str(node.name), node

    async def confirm(self, ttls: dict[str, int]) -> bool:
        """Wait (up to the timeout) until a replica of each key's master has its writes;
        whether every one did. Never raises (a replica's silence, a Redis error, anything
        else): the caller has made its writes, and they stand, unconfirmed."""
        if self.replicas <= 0 or not ttls:
            return True
        try:
            return await self._confirm(ttls)
        except Exception as exc:  # after an admission: never a 500 for a job that was accepted
            log.warning("could not confirm writes on a replica: %s: %s", type(exc).__name__, exc)
            self.unconfirmed += 1
            return False

    async def _confirm(self, ttls: dict[str, int]) -> bool:
        now = time.monotonic()
        by_master: dict[str, tuple[Any, list[tuple[str, int]]]] = {}
        for key, ttl in ttls.items():
            name, node = self._master(key)
            if self._skip_until.get(name, 0.0) <= now:
                by_master.setdefault(name, (node, []))[1].append((key, ttl))
        if not by_master:
            self.unconfirmed += 1
            return False
        at: list[int] = []  # where each master's WAIT is in the replies
        queued = 0
        async with self.r.pipeline(transaction=False) as pipe:
            for node, touched in by_master.values():
                for key, ttl in touched:
                    pipe.expire(key, max(1, int(ttl)))
                    queued += 1
                # After the touch, on the same connection (a cluster pipeline sends one node's
                # commands on one connection, in order).
                target = {"target_nodes": node} if self.cluster else {}
                pipe.execute_command("WAIT", self.replicas, self.timeout_ms, **target)
                at.append(queued)
                queued += 1
            try:
                replies = await pipe.execute(raise_on_error=False)
            except RedisError as exc:
                log.warning("could not confirm writes on a replica: %s", exc)
                self.unconfirmed += 1
                return False
        ok = True
        for name, i in zip(by_master, at, strict=True):
            got = replies[i]
            if isinstance(got, BaseException) or int(got) < self.replicas:
                ok = False
                self._skip_until[name] = time.monotonic() + BACKOFF_S
                log.warning(
                    "Redis %s: %s of %d replicas confirmed a write within %d ms; not waiting on it "
                    "for %.0f s (its writes may not survive a failover meanwhile)",
                    name, got, self.replicas, self.timeout_ms, BACKOFF_S,
                )  # fmt: skip
        if ok:
            self.confirmed += 1
        else:
            self.unconfirmed += 1
        return ok
