"""One connection factory for every service.

``redis://host:port/db`` gives a real ``redis.asyncio`` client (``redis+sentinel://`` the
master of a Sentinel service, ``redis+cluster://`` a Redis Cluster client); ``memory://`` gives a
fakeredis client on one process-wide ``FakeServer``: the zero-setup default, with which
``nightjar up`` runs the gateway, planner and worker in one process.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import unquote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection
from redis.asyncio.sentinel import SentinelManagedConnection
from redis.exceptions import ConnectionError as RedisConnectionError

from shared.settings import DEFAULT_MAX_CONNECTIONS as DEFAULT_MAX_CONNECTIONS  # re-exported
from shared.settings import RuntimeSettings

if TYPE_CHECKING:
    import fakeredis

DEFAULT_URL = "memory://"
ENV_VAR = "NIGHTJAR_REDIS_URL"
MAX_CONNECTIONS_VAR = "NIGHTJAR_REDIS_MAX_CONNECTIONS"
# Every open event stream holds a connection in a blocking XREAD, so a gateway under load
# needs one per client in flight; redis-py's default pool (100, then an error) is far too
# small. Past the cap (RuntimeSettings.redis_max_connections) a caller waits for a
# free connection instead of failing.
POOL_WAIT_S = 30.0
CONNECT_TIMEOUT_S = 5.0  # a Redis that does not answer a connect (a dead host) fails fast
HEALTH_CHECK_S = 30  # a connection idle this long is PINGed before its next command
# Every connection, to a Redis or a Sentinel: a connect that hangs (a host gone, its packets
# dropped) fails within CONNECT_TIMEOUT_S instead of the OS's minutes; TCP keepalive finds a
# peer that vanished under an idle (or blocked-reading) connection.
SOCKET_OPTIONS: dict[str, Any] = {"socket_connect_timeout": CONNECT_TIMEOUT_S, "socket_keepalive": True}

_fake_server: fakeredis.FakeServer | None = None
_fake_lock = threading.Lock()


class _ClosedTransportIsConnectionError:
    """Under uvloop, a write on a transport the server closed (a Redis that died since the
    connection was last used) raises ``RuntimeError("unable to perform operation on
    <TCPTransport closed=True ...>")``, which redis-py passes through: a Redis Cluster client
    then neither marks the node failed nor finds the promoted replica, and a service loop
    that rides out Redis outages (``RedisError``) dies instead. Here it is the
    ``ConnectionError`` it is (the connection is already dropped by redis-py)."""

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        try:
            await super().send_packed_command(command, check_health)  # type: ignore[misc]
        except RuntimeError as exc:
            if "closed" not in str(exc):
                raise
            raise RedisConnectionError(f"Error while writing to socket: {exc}") from exc


class _Connection(_ClosedTransportIsConnectionError, Connection):
    pass


class _SSLConnection(_ClosedTransportIsConnectionError, SSLConnection):
    pass


class _UnixConnection(_ClosedTransportIsConnectionError, UnixDomainSocketConnection):
    pass


class _SentinelConnection(_ClosedTransportIsConnectionError, SentinelManagedConnection):
    pass


_SAFE: dict[type, type] = {
    Connection: _Connection,
    SSLConnection: _SSLConnection,
    UnixDomainSocketConnection: _UnixConnection,
}


def default_url() -> str:
    """NIGHTJAR_REDIS_URL, else ``memory://``."""
    return RuntimeSettings().redis_url


def _max_connections() -> int:
    return RuntimeSettings().redis_max_connections


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
            max_connections=_max_connections(),
            timeout=POOL_WAIT_S,
            decode_responses=False,
            socket_timeout=None,
            health_check_interval=HEALTH_CHECK_S,
            **SOCKET_OPTIONS,
            **_reconnect_once(),
        )
        pool.connection_class = _SAFE.get(pool.connection_class, pool.connection_class)
        return aioredis.Redis(connection_pool=pool)
    if url.startswith("redis+sentinel://"):
        return _sentinel(url)
    if url.startswith(("redis+cluster://", "rediss+cluster://")):
        return _cluster(url)
    raise ValueError(
        f"unsupported Redis URL {url!r}: use redis://host:port/db, redis+sentinel://host:port[,host:port]"
        "/service[/db], redis+cluster://host:port[,host:port] or memory://"
    )


def _reconnect_once() -> dict[str, Any]:
    """A command that meets a pooled connection Redis closed (it restarted since the
    connection was last used) reconnects and is sent once more, instead of failing with
    "Connection closed by server" while Redis is up again. Safe to resend: the writes that
    must happen once are idempotent (admission by job id, the worker's fenced writes by wseq);
    a resent telemetry or decision entry is one more sample, harmless."""
    from redis.asyncio.retry import Retry
    from redis.backoff import ExponentialBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError

    retry = Retry(ExponentialBackoff(cap=0.2, base=0.02), 1)
    return {"retry": retry, "retry_on_error": [RedisConnectionError]}


def _hosts(netloc: str) -> tuple[str | None, list[tuple[str, int]]]:
    """(password, [(host, port)]) of ``[:password@]host:port[,host:port...]``."""
    auth, _, hosts = netloc.rpartition("@")
    password = unquote(auth.partition(":")[2]) if auth else None
    out = []
    for part in hosts.split(","):
        host, _, port = part.strip().rpartition(":")
        out.append((host or part.strip(), int(port) if host else 6379))
    return password or None, out


def _sentinel(url: str) -> aioredis.Redis:
    """``redis+sentinel://[:password@]host:port[,host:port]/service[/db]``: the service's
    master as Sentinel reports it (failovers followed on reconnect)."""
    from redis.asyncio.sentinel import Sentinel

    parts = urlsplit(url)
    password, hosts = _hosts(parts.netloc)
    path = [p for p in parts.path.split("/") if p]
    if not path:
        raise ValueError(f"{url!r}: name the Sentinel service: redis+sentinel://host:port/service[/db]")
    db = int(path[1]) if len(path) > 1 else 0
    sentinel = Sentinel(hosts, socket_timeout=None, sentinel_kwargs={"password": password, **SOCKET_OPTIONS})
    return sentinel.master_for(
        path[0],
        redis_class=aioredis.Redis,
        connection_class=_SentinelConnection,
        db=db,
        password=password,
        decode_responses=False,
        socket_timeout=None,
        health_check_interval=HEALTH_CHECK_S,
        **SOCKET_OPTIONS,
    )


def _cluster(url: str) -> aioredis.Redis:
    """``redis+cluster://[:password@]host:port[,host:port]``: a Redis Cluster client. Every
    script and transaction of Nightjar touches one hash tag (``shared.keys``): one slot."""
    from redis.asyncio.cluster import ClusterNode, RedisCluster

    parts = urlsplit(url)
    password, hosts = _hosts(parts.netloc)
    client = RedisCluster(
        startup_nodes=[ClusterNode(h, p) for h, p in hosts],
        password=password,
        ssl=url.startswith("rediss+"),
        decode_responses=False,
        socket_timeout=None,
        health_check_interval=HEALTH_CHECK_S,
        max_connections=_max_connections(),
        **SOCKET_OPTIONS,
    )
    # The nodes it discovers (every node, at the first command) are made with these options;
    # RedisCluster takes no connection class of its own.
    options = client.nodes_manager.connection_kwargs
    options["connection_class"] = _SAFE.get(options["connection_class"], options["connection_class"])
    return cast(aioredis.Redis, client)
