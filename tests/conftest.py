"""Suite-wide setup and the fixtures most folders share."""

import atexit
import os
import shutil
import tempfile

# Every test, and every process a test starts, caches under a folder of this session's (cost
# profiles, `nightjar up`'s store address), never in the developer's ~/.cache/nightjar.
os.environ["NIGHTJAR_CACHE"] = tempfile.mkdtemp(prefix="nightjar-test-cache-")

# Triton reads this when a kernel is decorated, so it must be set before any test module
# imports nj_kernels.triton_*: Triton kernels then run on CPU tensors through its interpreter.
os.environ.setdefault("TRITON_INTERPRET", "1")

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import redis.asyncio as aioredis

from shared.connection import connect, reset_fake_server

atexit.register(shutil.rmtree, os.environ["NIGHTJAR_CACHE"], True)


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
