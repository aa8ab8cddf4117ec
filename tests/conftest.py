"""Suite-wide setup and the fixtures most folders share."""

import os

# Triton reads this when a kernel is decorated, so it must be set before any test module
# imports nj_kernels.triton_*: Triton kernels then run on CPU tensors through its interpreter.
os.environ.setdefault("TRITON_INTERPRET", "1")

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import redis.asyncio as aioredis

from shared.connection import connect, reset_fake_server


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def r() -> AsyncIterator[aioredis.Redis]:
    """A client of a fresh embedded Redis (tests on the real server override this)."""
    reset_fake_server()
    client = connect("memory://")
    yield client
    await client.aclose()


@asynccontextmanager
async def flushed_redis(url: str) -> AsyncIterator[aioredis.Redis]:
    """A client of the real Redis database ``url``, flushed before and after."""
    client = connect(url)
    await client.flushdb()
    try:
        yield client
    finally:
        await client.flushdb()
        await client.aclose()
