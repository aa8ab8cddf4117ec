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


def test_default_url_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(connection.ENV_VAR, raising=False)
    assert connection.default_url() == "memory://"
    monkeypatch.setenv(connection.ENV_VAR, "redis://h:1/2")
    assert connection.default_url() == "redis://h:1/2"


def test_unknown_scheme_is_refused() -> None:
    with pytest.raises(ValueError, match="unsupported Redis URL"):
        connection.connect("http://x")
