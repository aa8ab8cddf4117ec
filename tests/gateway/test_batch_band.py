"""Batches have their own band: their jobs wait on the model's batch stream, bounded by
``max_batch_queue`` and never counted against ``max_queue``; live traffic is admitted (202,
not 429) with the batch band full, and a worker takes live jobs before batch ones."""

from __future__ import annotations

import json

import pytest
import redis.asyncio as aioredis

from shared import codec, keys
from shared.batch_band import BatchBand
from shared.schemas import JobRequest
from shared.streams import ensure_group, entries
from tests.gateway.batch_helpers import _req, _upload
from tests.gateway.conftest import MODEL, gateway

pytestmark = pytest.mark.anyio


def _job(entry: tuple) -> JobRequest:  # type: ignore[type-arg]
    return codec.decode_as(entry[1][codec.FIELD], JobRequest)


async def _batch(gw, n: int) -> dict:  # type: ignore[no-untyped-def]
    content = "".join(json.dumps(_req(f"c{i}", f"x{i}")) + "\n" for i in range(n)).encode()
    file = (await _upload(gw, content)).json()
    resp = await gw.post(
        "/v1/batches", json={"input_file_id": file["id"], "endpoint": "/v1/chat/completions"}
    )
    assert resp.status_code == 200, resp.text
    out: dict = resp.json()
    return out


async def test_a_full_batch_band_leaves_live_traffic_admitted(r: aioredis.Redis) -> None:
    async with gateway(r, max_queue=2, max_batch_queue=3) as gw:
        batch = await _batch(gw, 5)
        # 3 lines fit the batch band; the other 2 failed with queue_full (recorded in the batch).
        assert batch["request_counts"] == {"total": 5, "completed": 0, "failed": 2}
        assert await r.xlen(keys.batch_stream(MODEL)) == 3
        assert await r.xlen(keys.jobs_stream(MODEL)) == 0
        live = [await gw.post("/v1/jobs", json={"prompt": "hi"}) for _ in range(2)]
        assert [x.status_code for x in live] == [202, 202]
        chat = await gw.post(
            "/v1/jobs", json=[{"messages": [{"role": "user", "content": "a"}]}]
        )  # the live band is full now (2 of 2): 429 for live only
        assert chat.status_code == 429
        more = await _batch(gw, 1)  # and the batch band is full too
        assert more["request_counts"]["failed"] == 1
        health = (await gw.get("/health")).json()
        assert health["queued"] == 2 and health["batch_queued"] == 3


async def test_live_jobs_are_read_before_batch_jobs_and_moved_ones_are_not_live_load(
    r: aioredis.Redis,
) -> None:
    stream = keys.jobs_stream(MODEL)
    async with gateway(r, max_queue=2, max_batch_queue=10) as gw:
        await _batch(gw, 4)
        await gw.post("/v1/jobs", json={"prompt": "live"})
        await ensure_group(r, stream, keys.JOBS_GROUP)
        band = BatchBand(r, MODEL)
        assert await band.promote(10) == 0  # a live job waits: no batch job moves
        (live,) = entries(await r.xreadgroup(keys.JOBS_GROUP, "w", {stream: ">"}, count=10))
        assert _job(live).prompt == "live"
        assert await band.promote(3) == 3  # nothing live waits: 3 batch jobs move over
        assert await r.xlen(keys.batch_stream(MODEL)) == 1
        # 1 live job running + 3 moved batch jobs on the stream: the live load is 1 of 2.
        assert (await gw.post("/v1/jobs", json={"prompt": "live 2"})).status_code == 202
        assert (await gw.post("/v1/jobs", json={"prompt": "live 3"})).status_code == 429
        got = entries(await r.xreadgroup(keys.JOBS_GROUP, "w", {stream: ">"}, count=10))
        # The 3 moved batch jobs, then live 2 (it came after them).
        assert [_job(e).job_id.startswith("batch_") for e in got] == [True, True, True, False]
        assert await band.promote(10) == 1  # the last batch job, once nothing live waits
