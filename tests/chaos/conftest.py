"""One chaos cluster for the whole suite: its own Redis (AOF) and the four service processes.

Each test starts from a healthy cluster (``healthy`` resumes paused services, restarts dead
ones and waits until all are ready) and may break it as it likes.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis

from shared.connection import connect
from tests.chaos.cluster import Cluster, RedisServer
from tests.chaos.jobs import precompute_references
from tests.tiny_models import build_llama


@pytest.fixture(scope="session")
def chaos_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_llama(tmp_path_factory.mktemp("chaos-model") / "tiny-llama")


@pytest.fixture(scope="session")
def chaos_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    if shutil.which("redis-server") is None:
        pytest.skip("the chaos suite starts its own redis-server, and there is none on PATH")
    server = RedisServer(tmp_path_factory.mktemp("chaos-redis"))
    server.start()
    yield server
    if server.alive():
        server.stop()


@pytest.fixture(scope="session")
def cluster(
    chaos_redis: RedisServer, chaos_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    keep = os.environ.get("NIGHTJAR_CHAOS_LOGS")  # a directory to keep the processes' logs in (CI artifacts)
    logs = Path(keep) if keep else tmp_path_factory.mktemp("chaos-logs")
    logs.mkdir(parents=True, exist_ok=True)
    c = Cluster(chaos_redis, chaos_model, logs)
    c.start_all()
    try:
        precompute_references(chaos_model)  # while the services start
        yield c
    finally:
        c.stop_all()
        print(f"chaos cluster logs: {c.logs}")


@pytest.fixture
async def r(chaos_redis: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = connect(chaos_redis.url())
    yield client
    await client.aclose()


@pytest.fixture
async def healthy(cluster: Cluster, r: aioredis.Redis) -> Cluster:
    await cluster.heal(r)
    return cluster


@pytest.fixture
async def gw(healthy: Cluster) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=healthy.url, timeout=60) as client:
        yield client
