"""A write on a connection whose transport is closed is a ConnectionError, on uvloop too.

uvloop raises ``RuntimeError`` for a write on a closed transport (the stdlib loop does not);
redis-py passes it through, so a Redis Cluster client did not fail over to the promoted
replica and a worker's outbox died on it (seen killing a cluster master, tests/cluster).
Every client ``connect`` makes uses connection classes that turn it into the
``ConnectionError`` every service loop already rides out.
"""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError

from shared import connection
from shared.connection import connect


@pytest.fixture(params=[pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"), "asyncio"])
def anyio_backend(request: pytest.FixtureRequest) -> object:
    return request.param


async def _closed_connection(cls: type) -> object:
    """A connection of ``cls`` over a real loopback socket whose transport was closed under it."""
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    conn = cls(host="127.0.0.1", port=port)
    conn._reader, conn._writer = reader, writer  # connected, without redis-py's handshake
    writer.transport.close()  # what uvloop does to a transport after the peer reset it
    await asyncio.sleep(0)
    server.close()
    return conn


@pytest.mark.anyio
async def test_a_write_on_a_closed_transport_is_a_connection_error() -> None:
    conn = await _closed_connection(connection._Connection)
    with pytest.raises(RedisConnectionError):
        await conn.send_packed_command(b"*1\r\n$4\r\nPING\r\n", check_health=False)  # type: ignore[attr-defined]


def test_every_url_kind_gets_the_safe_connection_classes() -> None:
    plain = connect("redis://127.0.0.1:1/0")
    assert plain.connection_pool.connection_class is connection._Connection
    assert connect("rediss://127.0.0.1:1/0").connection_pool.connection_class is connection._SSLConnection
    assert connect("unix:///tmp/nope.sock").connection_pool.connection_class is connection._UnixConnection
    sentinel = connect("redis+sentinel://127.0.0.1:1/svc")
    assert sentinel.connection_pool.connection_class is connection._SentinelConnection
    cluster = connect("redis+cluster://127.0.0.1:1")
    assert isinstance(cluster, RedisCluster)
    assert cluster.nodes_manager.connection_kwargs["connection_class"] is connection._Connection
