"""WAIT for a replica before answering (shared/replication.py): when, and without one."""

from __future__ import annotations

import pytest

from shared.connection import connect
from shared.replication import ReplicaWait, wanted_replicas
from tests.conftest import flushed_redis


def test_replicas_are_waited_for_where_they_exist_by_design(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NIGHTJAR_REDIS_WAIT_REPLICAS", raising=False)
    assert wanted_replicas("redis+sentinel://h:26379/svc") == wanted_replicas("redis+cluster://h:7000") == 1
    assert wanted_replicas("redis://h:6379/0") == wanted_replicas("memory://") == 0
    monkeypatch.setenv("NIGHTJAR_REDIS_WAIT_REPLICAS", "2")
    assert wanted_replicas("redis://h:6379/0") == 2


@pytest.mark.anyio
async def test_off_it_sends_nothing() -> None:
    w = ReplicaWait(connect("memory://"), replicas=0)
    assert await w.confirm({"k": 10}) and w.confirmed == 0


@pytest.mark.redis
@pytest.mark.anyio
async def test_a_master_without_replicas_is_not_waited_on_for_a_while() -> None:
    """A Redis with no replica (as a promoted master is until its old master returns): the
    first confirmation times out and says so; the next ones do not wait at all."""
    async with flushed_redis("redis://127.0.0.1:6379/12") as r:
        await r.set("nj:test:k", b"v", ex=100)
        w = ReplicaWait(r, replicas=1, timeout_ms=50)
        before = int((await r.info("commandstats")).get("cmdstat_wait", {}).get("calls", 0))
        assert not await w.confirm({"nj:test:k": 100})
        assert not await w.confirm({"nj:test:k": 100})
        after = int((await r.info("commandstats")).get("cmdstat_wait", {}).get("calls", 0))
        assert after - before == 1 and w.unconfirmed == 2
        assert 0 < await r.ttl("nj:test:k") <= 100  # touched with its own TTL, nothing else


class _Broken:
    """A client whose every pipeline fails with an error that is not a RedisError."""

    def pipeline(self, *args: object, **kwargs: object) -> object:
        raise ValueError("not a Redis error")


@pytest.mark.anyio
async def test_any_failure_to_confirm_is_an_unconfirmed_write_not_an_error() -> None:
    w = ReplicaWait(connect("memory://"), replicas=1, timeout_ms=50)
    w.r = _Broken()  # type: ignore[assignment]
    assert not await w.confirm({"k": 10})
    assert w.unconfirmed == 1 and w.confirmed == 0
