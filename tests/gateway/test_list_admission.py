"""A list submitted to POST /v1/jobs is all or nothing: admitted by one script, or refused
whole (429 when it does not fit the queue, 409 / 400 when one job is wrong) with nothing
enqueued, indexed or left half-written. Runs on the embedded store and, with
NIGHTJAR_GATEWAY_TEST_REDIS, on a real Redis."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from shared import codec, keys
from shared.schemas import JobRequest
from tests.gateway.conftest import MODEL, gateway

pytestmark = pytest.mark.anyio


async def _nothing_written(r: aioredis.Redis) -> None:
    assert await r.xlen(keys.jobs_stream(MODEL)) == 0
    assert await r.zcard(keys.owner_jobs("")) == 0
    assert not [k async for k in r.scan_iter(match=keys.job_key(MODEL, "*"))]


async def test_a_list_that_does_not_fit_is_refused_whole(r: aioredis.Redis) -> None:
    async with gateway(r, max_queue=5) as gw:
        big = await gw.post("/v1/jobs", json=[{"prompt": f"p{i}"} for i in range(8)])
        assert big.status_code == 429, big.text
        err = big.json()["error"]
        assert err["code"] == "queue_full" and "nothing was enqueued" in err["message"]
        await _nothing_written(r)
        small = await gw.post("/v1/jobs", json=[{"prompt": f"p{i}"} for i in range(3)])
        assert small.status_code == 202, small.text
        ids = [d["id"] for d in small.json()["data"]]
        assert len(set(ids)) == 3 and await r.xlen(keys.jobs_stream(MODEL)) == 3
        # 3 queued, limit 5: a list of 3 more does not fit (nothing of it is taken) ...
        over = await gw.post("/v1/jobs", json=[{"prompt": "q"}] * 3)
        assert over.status_code == 429 and await r.xlen(keys.jobs_stream(MODEL)) == 3
        # ... a list of 2 does, exactly.
        fits = await gw.post("/v1/jobs", json=[{"prompt": "q"}] * 2)
        assert fits.status_code == 202 and await r.xlen(keys.jobs_stream(MODEL)) == 5
        listed = (await gw.get("/v1/jobs", params={"limit": 100})).json()["data"]
        assert len(listed) == 5


async def test_a_bad_job_in_a_list_refuses_the_list_before_anything_is_written(r: aioredis.Redis) -> None:
    async with gateway(r) as gw:
        bad = await gw.post("/v1/jobs", json=[{"prompt": "a"}, {"prompt": "b", "temperature": 99}])
        assert bad.status_code == 400, bad.text
        await _nothing_written(r)
        dup = await gw.post("/v1/jobs", json=[{"prompt": "a", "id": "same"}, {"prompt": "b", "id": "same"}])
        assert dup.status_code == 400, dup.text
        await _nothing_written(r)


async def test_a_retried_keyed_list_is_the_same_jobs_and_a_changed_one_conflicts(r: aioredis.Redis) -> None:
    bodies = [{"prompt": f"p{i}"} for i in range(3)]
    async with gateway(r, max_queue=3) as gw:
        first = await gw.post("/v1/jobs", json=bodies, headers={"Idempotency-Key": "k"})
        # The queue is full now: a retry still gets its jobs.
        again = await gw.post("/v1/jobs", json=bodies, headers={"Idempotency-Key": "k"})
        changed = await gw.post(
            "/v1/jobs", json=[*bodies[:2], {"prompt": "other"}], headers={"Idempotency-Key": "k"}
        )
    assert first.status_code == 202 and again.status_code == 202, again.text
    assert [d["id"] for d in again.json()["data"]] == [d["id"] for d in first.json()["data"]]
    assert changed.status_code == 409, changed.text
    assert await r.xlen(keys.jobs_stream(MODEL)) == 3


async def test_concurrent_lists_never_overfill_the_queue_or_land_in_part(r: aioredis.Redis) -> None:
    import anyio

    codes: list[int] = []
    async with gateway(r, max_queue=10) as gw:

        async def submit(i: int) -> None:
            resp = await gw.post("/v1/jobs", json=[{"prompt": f"l{i}-{j}"} for j in range(3)])
            codes.append(resp.status_code)

        async with anyio.create_task_group() as tg:
            for i in range(12):
                tg.start_soon(submit, i)
    assert sorted(codes) == [202] * 3 + [429] * 9  # 3 lists of 3 fit in 10; a 4th would not
    prompts = [
        codec.decode_as(f[codec.FIELD], JobRequest).prompt for _, f in await r.xrange(keys.jobs_stream(MODEL))
    ]
    assert len(prompts) == 9
    lists = {p.split("-")[0] for p in prompts if p}
    assert all(sum(p.startswith(f"{x}-") for p in prompts if p) == 3 for x in lists)  # whole lists only
