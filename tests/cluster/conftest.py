"""The Redis Cluster suite's fixtures: one 3-master / 3-replica cluster of redis-server
processes on loopback for the package, and the Nightjar services (gateway, planner, two
workers serving the tiny model) on it through ``redis+cluster://``.

Every test starts from a healthy deployment (``healthy``: dead services restarted, every
worker registered, a decision published, no job left running); the failover test breaks the
cluster itself, so it runs last in the package (test_failover.py) and the cluster is not
healed after it.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis

from shared.connection import connect
from tests.chaos.cluster import Cluster
from tests.cluster.servers import RedisCluster
from tests.tiny_models import build_llama


@pytest.fixture(scope="package")
def topology_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_llama(tmp_path_factory.mktemp("cluster-model") / "tiny-llama")


@pytest.fixture(scope="package")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    cluster = RedisCluster(tmp_path_factory.mktemp("redis-cluster"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="package")
def services(
    redis_cluster: RedisCluster, topology_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    keep = os.environ.get("NIGHTJAR_CHAOS_LOGS")
    logs = Path(keep) / "cluster" if keep else tmp_path_factory.mktemp("cluster-logs")
    logs.mkdir(parents=True, exist_ok=True)
    # No startup cost profile: the static policy needs no prior, and 2 shared cores do not
    # need two workers timing their engines while the other processes start.
    c = Cluster(None, topology_model, logs, redis_url=redis_cluster.url, worker_args=("--no-profile",))
    c.start_all()
    try:
        yield c
    finally:
        c.stop_all()
        print(f"cluster suite logs: {c.logs}")


@pytest.fixture
async def r(redis_cluster: RedisCluster) -> AsyncIterator[aioredis.Redis]:
    client = connect(redis_cluster.url)
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
