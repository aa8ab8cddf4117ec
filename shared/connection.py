"""One connection factory for every service.

``redis://host:port/db`` gives a real ``redis.asyncio`` client; ``memory://`` gives a
fakeredis client on one process-wide ``FakeServer``: the zero-setup default, with which
``nightjar up`` runs the gateway, planner and worker in one process.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

import redis.asyncio as aioredis

if TYPE_CHECKING:
    import fakeredis

DEFAULT_URL = "memory://"
ENV_VAR = "NIGHTJAR_REDIS_URL"
MAX_CONNECTIONS_VAR = "NIGHTJAR_REDIS_MAX_CONNECTIONS"
# Every open event stream holds a connection in a blocking XREAD, so a gateway under load
# needs one per client in flight; redis-py's default pool (100, then an error) is far too
# small. Past the cap a caller waits for a free connection instead of failing.
DEFAULT_MAX_CONNECTIONS = 10_000
POOL_WAIT_S = 30.0

_fake_server: fakeredis.FakeServer | None = None
_fake_lock = threading.Lock()


def default_url() -> str:
    return os.environ.get(ENV_VAR, DEFAULT_URL)


def fake_server() -> fakeredis.FakeServer:
    """The process-wide FakeServer that every ``memory://`` client shares."""
    global _fake_server
    with _fake_lock:
        if _fake_server is None:
            import fakeredis

            _fake_server = fakeredis.FakeServer()
        return _fake_server


def reset_fake_server() -> None:
    """Forget the embedded server's data (tests)."""
    global _fake_server
    with _fake_lock:
        _fake_server = None


def connect(url: str | None = None) -> aioredis.Redis:
    """A client for ``url``; blocking stream reads never time out on the socket."""
    url = url or default_url()
    if url.startswith("memory://"):
        import fakeredis

        return fakeredis.FakeAsyncRedis(server=fake_server(), decode_responses=False)
    if url.startswith(("redis://", "rediss://", "unix://")):
        # redis-py's default socket_timeout=5 would cut XREADGROUP BLOCK waits short.
        pool = aioredis.BlockingConnectionPool.from_url(
            url,
            max_connections=int(os.environ.get(MAX_CONNECTIONS_VAR, DEFAULT_MAX_CONNECTIONS)),
            timeout=POOL_WAIT_S,
            decode_responses=False,
            socket_timeout=None,
            health_check_interval=30,
        )
        return aioredis.Redis(connection_pool=pool)
    raise ValueError(f"unsupported Redis URL {url!r}: use redis://host:port/db or memory://")
