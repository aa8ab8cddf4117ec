"""The services end to end on a real Redis Cluster (3 masters, 3 replicas, redis+cluster://):
submit, stream, cancel, idempotency, listing, a batch, and proof, from the nodes themselves,
that a model's keys, streams and scripts live in one slot. A worker's and a master's failover
are in test_failover.py (which runs after these: they break the deployment).
"""

from __future__ import annotations

import json

import anyio
import httpx
import pytest
import redis
import redis.asyncio as aioredis

from shared import keys
from tests.chaos import names
from tests.chaos.cluster import Cluster
from tests.chaos.jobs import audit, expected_greedy, submit_all, tally, wait_all_ended
from tests.cluster.servers import RedisCluster
from tests.e2e.conftest import poll

pytestmark = [pytest.mark.cluster, pytest.mark.anyio]

N = 16  # tokens a job: enough to stream, few enough for 2 shared cores


def _tok(model_dir: object):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


async def test_jobs_and_openai_routes_are_exact_on_the_cluster(
    healthy: Cluster, gw: httpx.AsyncClient, r: aioredis.Redis
) -> None:
    """Jobs through the job API (followed over SSE) and the OpenAI routes (plain and streamed)
    at once: every output is transformers' greedy one, every token once, both workers serve."""
    prompts = [f"Cluster job {i} says" for i in range(6)]
    accepted = await submit_all(gw, prompts, max_tokens=N, ignore_eos=True)
    texts: dict[str, str] = {}

    async def completion(prompt: str, stream: bool) -> None:
        body = {"prompt": prompt, "max_tokens": N, "temperature": 0, "ignore_eos": True, "stream": stream}
        if not stream:
            resp = await gw.post("/v1/completions", json=body)
            assert resp.status_code == 200, resp.text
            texts[prompt] = resp.json()["choices"][0]["text"]
            return
        parts = []
        async with gw.stream("POST", "/v1/completions", json=body) as resp:
            assert resp.status_code == 200
            async for line in resp.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    parts += [c["text"] for c in json.loads(line[6:])["choices"]]
        texts[prompt] = "".join(parts)

    sse: dict[str, list[int]] = {}

    async def follow(job_id: str) -> None:
        async with gw.stream("GET", f"/v1/jobs/{job_id}/events") as resp:
            tokens: list[int] = []
            async for line in resp.aiter_lines():
                if line.startswith("data: "):
                    ev = json.loads(line[6:])
                    if "index" in ev:
                        assert ev["index"] == len(tokens), "a token twice or a gap"
                        tokens += ev["token_ids"]
        sse[job_id] = tokens

    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:
            for job_id in accepted:
                tg.start_soon(follow, job_id)
            tg.start_soon(completion, "Plain completion on a cluster", False)
            tg.start_soon(completion, "Streamed completion on a cluster", True)
    await wait_all_ended(r, list(accepted), 60, "the job API's jobs")
    expected = {j: expected_greedy(healthy.model_dir, p, N) for j, p in accepted.items()}
    audits = [await audit(r, j) for j in accepted]
    t = tally(audits, expected)
    assert t.clean() and t.failed == 0, t
    assert sse == expected
    assert {w for a in audits for w in a.workers} == set(healthy.workers)
    tok = _tok(healthy.model_dir)
    for prompt, text in texts.items():
        assert text == tok.decode(expected_greedy(healthy.model_dir, prompt, N), skip_special_tokens=True)


async def test_cancel_mid_stream(healthy: Cluster, gw: httpx.AsyncClient) -> None:
    body = {"prompt": "cancel me", "params": {"max_tokens": 3000, "ignore_eos": True}}
    job_id = (await gw.post("/v1/jobs", json=body)).json()["id"]
    kinds: list[str] = []
    with anyio.fail_after(60):
        async with gw.stream("GET", f"/v1/jobs/{job_id}/events") as events:
            async for line in events.aiter_lines():
                if line.startswith("event: "):
                    kinds.append(line[7:])
                    if kinds.count("token") == 3 and line[7:] == "token":
                        assert (await gw.delete(f"/v1/jobs/{job_id}")).status_code == 202
    info = (await gw.get(f"/v1/jobs/{job_id}")).json()
    assert kinds[-1] == "finish" and info["status"] == "cancelled", info
    assert 3 <= info["result"]["completion_tokens"] < 3000


async def test_idempotency_and_listing(healthy: Cluster, gw: httpx.AsyncClient, r: aioredis.Redis) -> None:
    """A retried submit with its Idempotency-Key is the same job (and another body under that
    key a 409); the listing holds every job, newest first, filtered by status. The binding of
    an id to its model, the owner's index and the job live in three slots."""
    body = {"prompt": "Idempotent on a cluster", "params": {"max_tokens": 4, "ignore_eos": True}}
    first = await gw.post("/v1/jobs", json=body, headers={"Idempotency-Key": "cluster-key-1"})
    again = await gw.post("/v1/jobs", json=body, headers={"Idempotency-Key": "cluster-key-1"})
    other = await gw.post(
        "/v1/jobs", json={**body, "prompt": "something else"}, headers={"Idempotency-Key": "cluster-key-1"}
    )
    assert first.status_code == again.status_code == 202 and other.status_code == 409, other.text
    job_id = first.json()["id"]
    assert again.json()["id"] == job_id and again.headers.get("idempotent-replayed") == "true"
    more = list(await submit_all(gw, ["Listed one", "Listed two"], max_tokens=4, ignore_eos=True))
    await wait_all_ended(r, [job_id, *more], 60, "the listed jobs")
    listed = (await gw.get("/v1/jobs", params={"limit": 100})).json()["data"]
    ids = [j["id"] for j in listed]
    assert {job_id, *more} <= set(ids)
    assert ids.index(more[-1]) < ids.index(job_id)  # newest first
    finished = (await gw.get("/v1/jobs", params={"status": "finished", "limit": 100})).json()["data"]
    assert {job_id, *more} <= {j["id"] for j in finished}
    assert all(j["status"] == "finished" for j in finished)


async def test_a_batch(healthy: Cluster, gw: httpx.AsyncClient) -> None:
    prompts = ["Batch line one", "Batch line two", "Batch line three"]
    lines = [
        {
            "custom_id": f"c{i}",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"prompt": p, "max_tokens": 6, "temperature": 0, "ignore_eos": True},
        }
        for i, p in enumerate(prompts)
    ]
    content = "\n".join(json.dumps(x) for x in lines).encode()
    up = await gw.post("/v1/files", data={"purpose": "batch"}, files={"file": ("in.jsonl", content)})
    assert up.status_code == 200, up.text
    created = await gw.post(
        "/v1/batches",
        json={"input_file_id": up.json()["id"], "endpoint": "/v1/completions", "completion_window": "24h"},
    )
    assert created.status_code == 200, created.text

    async def done() -> dict | None:
        got = (await gw.get(f"/v1/batches/{created.json()['id']}")).json()
        return got if got["status"] in ("completed", "failed", "cancelled") else None

    batch = await poll(done, 90, "the batch", every_s=0.2)
    assert isinstance(batch, dict) and batch["status"] == "completed", batch
    assert batch["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
    out = (await gw.get(f"/v1/files/{batch['output_file_id']}/content")).text
    got = {
        o["custom_id"]: o["response"]["body"]["choices"][0]["text"] for o in map(json.loads, out.splitlines())
    }
    tok = _tok(healthy.model_dir)
    for i, p in enumerate(prompts):
        assert got[f"c{i}"] == tok.decode(expected_greedy(healthy.model_dir, p, 6), skip_special_tokens=True)
    listed = (await gw.get("/v1/batches")).json()["data"]
    assert created.json()["id"] in {b["id"] for b in listed}


async def test_a_models_keys_streams_and_scripts_stay_in_one_slot(
    healthy: Cluster, redis_cluster: RedisCluster
) -> None:
    """Read from the nodes, after the tests above ran: every key of the model's queue and jobs
    is in one slot, on one master; no node ever answered CROSSSLOT (a multi-key command, a
    script or a transaction over several slots); the scripts ran (EVALSHA) on that master,
    and the gateway waited (WAIT) for its replica before answering each submit."""
    model_master = redis_cluster.master_of(names.jobs_stream())
    slot = redis_cluster.keyslot(names.jobs_stream())
    model_keys: list[str] = []
    crossslot: dict[int, int] = {}
    evalsha: dict[int, int] = {}
    waits: dict[int, int] = {}
    for port in redis_cluster.shards():
        node = redis_cluster.nodes[port]
        with node.client() as c:
            found = [k.decode() for k in c.scan_iter(match=f"nj:{{{names.MODEL}}}:*", count=1000)]
            if port != model_master:
                assert not found, f"keys of the model on another master {port}: {found[:5]}"
            model_keys += found
            errors = c.info("errorstats")
            crossslot[port] = int(errors.get("errorstat_CROSSSLOT", {}).get("count", 0))
            stats = c.info("commandstats")
            evalsha[port] = int(stats.get("cmdstat_evalsha", {}).get("calls", 0))
            waits[port] = int(stats.get("cmdstat_wait", {}).get("calls", 0))
    assert {keys.jobs_stream(names.MODEL), keys.finished_stream(names.MODEL)} <= set(model_keys)
    assert any(k.endswith(":events") for k in model_keys) and any(":job:" in k for k in model_keys)
    with redis_cluster.nodes[model_master].client() as c:
        slots = {int(c.execute_command("CLUSTER KEYSLOT", k)) for k in model_keys}
    assert slots == {slot}, f"the model's keys span slots {sorted(slots)}"
    assert not any(crossslot.values()), f"CROSSSLOT errors by node: {crossslot}"
    assert evalsha[model_master] > 0, evalsha
    # Every admission waited for the model master's replica before its 202 (shared/replication.py).
    assert waits[model_master] >= 10, waits
    # Another master redirects a plain client to the model's slot on its master (MOVED).
    other = next(p for p in redis_cluster.shards() if p != model_master)
    with redis_cluster.nodes[other].client() as c, pytest.raises(redis.ResponseError) as moved:
        c.xlen(names.jobs_stream())
    assert str(moved.value) == f"{slot} 127.0.0.1:{model_master}"
