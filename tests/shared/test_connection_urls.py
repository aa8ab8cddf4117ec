"""Sentinel and Cluster URLs make the right clients (constructed lazily: no server needed)."""

from __future__ import annotations

import pytest
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.sentinel import SentinelConnectionPool

from shared import keys
from shared.connection import connect


def test_a_sentinel_url_names_its_service_hosts_password_and_db() -> None:
    client = connect("redis+sentinel://:s3cret@h1:26379,h2:26380/mymaster/3")
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool) and pool.service_name == "mymaster"
    assert pool.connection_kwargs["db"] == 3 and pool.connection_kwargs["password"] == "s3cret"
    hosts = [
        (s.connection_pool.connection_kwargs["host"], s.connection_pool.connection_kwargs["port"])
        for s in pool.sentinel_manager.sentinels
    ]
    assert hosts == [("h1", 26379), ("h2", 26380)]
    with pytest.raises(ValueError, match="service"):
        connect("redis+sentinel://h1:26379")


def test_a_cluster_url_makes_a_cluster_client() -> None:
    client = connect("redis+cluster://127.0.0.1:7000,127.0.0.1:7001")
    assert isinstance(client, RedisCluster)
    with pytest.raises(ValueError, match="unsupported"):
        connect("http://nope")


def test_what_one_script_touches_shares_one_hash_slot() -> None:
    from redis.crc import key_slot

    for model in ("nj-target", "org/Model-7B:v2", "x" * 300):
        names = [
            keys.jobs_stream(model),
            keys.dead_letter_stream(model),
            keys.cancel_stream(model),
            keys.job_key(model, "j1"),
            keys.job_events(model, "j1"),
            keys.job_cancel(model, "j1"),
        ]
        assert len({key_slot(n.encode()) for n in names}) == 1, model


def test_every_url_kind_connects_with_a_timeout_keepalive_and_health_checks() -> None:
    want = {"socket_connect_timeout": 5.0, "socket_keepalive": True, "health_check_interval": 30}

    def has(kwargs: dict[str, object]) -> bool:
        return all(kwargs.get(k) == v for k, v in want.items())

    plain = connect("redis://127.0.0.1:6379/5").connection_pool.connection_kwargs
    assert has(plain) and plain["socket_timeout"] is None
    sentinel = connect("redis+sentinel://h1:26379/mymaster")
    assert has(sentinel.connection_pool.connection_kwargs)
    for s in sentinel.connection_pool.sentinel_manager.sentinels:  # type: ignore[attr-defined]
        opts = s.connection_pool.connection_kwargs
        assert opts["socket_connect_timeout"] == 5.0 and opts["socket_keepalive"] is True
    cluster = connect("redis+cluster://127.0.0.1:7000")
    assert isinstance(cluster, RedisCluster) and has(cluster.nodes_manager.connection_kwargs)
