from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from shared.connection import connect, reset_fake_server


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def r() -> AsyncIterator[aioredis.Redis]:
    reset_fake_server()
    client = connect("memory://")
    yield client
    await client.aclose()
