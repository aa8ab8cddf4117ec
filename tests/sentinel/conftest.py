"""The Sentinel suite's fixtures: one master, one replica and three sentinels (redis-server
processes on loopback), and the Nightjar services on them through ``redis+sentinel://``:
the gateway, the planner and one worker (2 shared cores: the failover, not the pool, is what
this suite tests; tests/cluster runs two workers)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis

from shared.connection import connect
from tests.chaos.cluster import Cluster
from tests.cluster.servers import SentinelSet
from tests.tiny_models import build_llama


@pytest.fixture(scope="package")
def sentinel_set(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelSet]:
    topology = SentinelSet(tmp_path_factory.mktemp("redis-sentinel"))
    try:
        topology.start()
        yield topology
    finally:
        topology.stop()


@pytest.fixture(scope="package")
def services(sentinel_set: SentinelSet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    model = build_llama(tmp_path_factory.mktemp("sentinel-model") / "tiny-llama")
    keep = os.environ.get("NIGHTJAR_CHAOS_LOGS")
    logs = Path(keep) / "sentinel" if keep else tmp_path_factory.mktemp("sentinel-logs")
    logs.mkdir(parents=True, exist_ok=True)
    c = Cluster(None, model, logs, workers=("wA",), redis_url=sentinel_set.url, worker_args=("--no-profile",))
    c.start_all()
    try:
        yield c
    finally:
        c.stop_all()
        print(f"sentinel suite logs: {c.logs}")


@pytest.fixture
async def r(sentinel_set: SentinelSet) -> AsyncIterator[aioredis.Redis]:
    client = connect(sentinel_set.url)
    yield client
    await client.aclose()


@pytest.fixture
async def healthy(services: Cluster, r: aioredis.Redis) -> Cluster:
    await services.heal(r)
    return services


@pytest.fixture
async def gw(healthy: Cluster) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=healthy.url, timeout=60) as client:
        yield client
