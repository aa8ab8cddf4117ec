"""A job admitted is answered as admitted, whatever confirming it on a replica runs into
(shared/replication.py): never a 500 after the job is in the queue."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from gateway.settings import GatewaySettings
from gateway.store import JobStore
from shared import keys
from shared.replication import ReplicaWait
from shared.schemas import JobRequest
from shared.streams import ensure_group
from tests.gateway.conftest import MODEL, register_worker

pytestmark = pytest.mark.anyio


class _Broken:
    def pipeline(self, *args: object, **kwargs: object) -> object:
        raise TypeError("not a Redis error")


async def test_a_submit_whose_confirmation_fails_is_still_admitted(r: aioredis.Redis) -> None:
    await register_worker(r)
    await ensure_group(r, keys.jobs_stream(MODEL), keys.JOBS_GROUP)
    store = JobStore(r, GatewaySettings())
    store.replicas = ReplicaWait(_Broken(), replicas=1)  # type: ignore[arg-type]
    job = JobRequest(job_id="a" * 32, prompt="x", model=MODEL)
    got = await store.submit(job, owner="o", fingerprint="f", fresh=True)
    assert got.created and got.status == "queued"
    assert store.replicas.unconfirmed == 1
    assert await r.exists(keys.job_key(MODEL, job.job_id))
