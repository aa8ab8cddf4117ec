from __future__ import annotations

import anyio
import pytest
import redis.asyncio as aioredis

from shared import connection

pytestmark = pytest.mark.anyio


async def test_memory_clients_share_one_server() -> None:
    connection.reset_fake_server()
    a, b = connection.connect("memory://"), connection.connect("memory://")
    await a.set("k", b"v")
    assert await b.get("k") == b"v"
    connection.reset_fake_server()
    assert await connection.connect("memory://").get("k") is None


async def test_blocked_read_wakes_on_another_clients_write() -> None:
    connection.reset_fake_server()
    reader, writer = connection.connect("memory://"), connection.connect("memory://")
    got: list[object] = []

    async def read() -> None:
        got.append(await reader.xread({"s": "$"}, block=10_000))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            await anyio.wait_all_tasks_blocked()  # the reader is blocked on "$" first
            await writer.xadd("s", {b"m": b"x"})
    assert got and got[0][0][1][0][1] == {b"m": b"x"}  # type: ignore[index]


def test_redis_url_gives_real_client_without_socket_timeout() -> None:
    client = connection.connect("redis://127.0.0.1:6379/5")
    assert isinstance(client, aioredis.Redis)
    kwargs = client.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] is None and kwargs["db"] == 5


def test_redis_pool_waits_for_a_connection_instead_of_failing(monkeypatch: pytest.MonkeyPatch) -> None:
    pool = connection.connect("redis://127.0.0.1:6379/5").connection_pool
    assert isinstance(pool, aioredis.BlockingConnectionPool)
    assert pool.max_connections == connection.DEFAULT_MAX_CONNECTIONS
    monkeypatch.setenv(connection.MAX_CONNECTIONS_VAR, "7")
    assert connection.connect("redis://127.0.0.1:6379/5").connection_pool.max_connections == 7


@pytest.mark.redis
async def test_more_blocked_readers_than_redis_pys_default_pool() -> None:
    """Each open event stream of the gateway holds a connection in XREAD BLOCK: 150 of them
    at once (redis-py's default pool stops at 100 with an error) all get their entry."""
    client = connection.connect("redis://127.0.0.1:6379/12")
    await client.delete("nj:test:fanout")
    got: list[object] = []

    async def read() -> None:
        got.append(await client.xread({"nj:test:fanout": "0-0"}, block=20_000))

    try:
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for _ in range(150):
                    tg.start_soon(read)
                await anyio.sleep(0.5)
                await client.xadd("nj:test:fanout", {b"m": b"x"})
        assert len(got) == 150 and all(got)
    finally:
        await client.delete("nj:test:fanout")
        await client.aclose()


def test_default_url_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(connection.ENV_VAR, raising=False)
    assert connection.default_url() == "memory://"
    monkeypatch.setenv(connection.ENV_VAR, "redis://h:1/2")
    assert connection.default_url() == "redis://h:1/2"


def test_unknown_scheme_is_refused() -> None:
    with pytest.raises(ValueError, match="unsupported Redis URL"):
        connection.connect("http://x")


@pytest.mark.redis
async def test_a_connection_redis_closed_is_reopened_for_the_next_command() -> None:
    """After a Redis restart every pooled connection is dead; the next command on one
    reconnects and goes through instead of failing with "Connection closed by server"."""
    client = connection.connect("redis://127.0.0.1:6379/12")
    killer = connection.connect("redis://127.0.0.1:6379/12")
    try:
        await client.set("nj:test:reconnect", b"1")
        own_id = await client.client_id()  # the one pooled connection
        assert await killer.client_kill_filter(_id=str(own_id)) == 1
        assert await client.get("nj:test:reconnect") == b"1"
    finally:
        await client.delete("nj:test:reconnect")
        await client.aclose()
        await killer.aclose()
