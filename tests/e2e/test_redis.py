"""The services as separate processes on the real Redis: one gateway, one planner, two workers.

Uses database 15 of the server at 127.0.0.1:6379, flushed before and after. Runs in file
order: the last test kills a worker.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx
import pytest
import redis
import redis.asyncio as aioredis

from shared import codec, keys
from shared.control import Decision
from shared.schemas import FinishEvent, StartEvent, TokenEvent
from tests.e2e.conftest import free_port, poll
from tests.tiny_models import reference_greedy

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.anyio]

REDIS_URL = "redis://127.0.0.1:6379/15"
WORKERS = ("wA", "wB")


@dataclass
class Cluster:
    url: str
    model_dir: Path
    procs: dict[str, subprocess.Popen[bytes]]
    logs: Path


def _spawn(name: str, args: list[str], logs: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "NIGHTJAR_REDIS_URL": REDIS_URL,
        "OMP_NUM_THREADS": "1",
        "NIGHTJAR_LOG_LEVEL": "info",
    }
    out = (logs / f"{name}.log").open("wb")
    return subprocess.Popen(
        [sys.executable, "-m", "nightjar", *args], stdout=out, stderr=subprocess.STDOUT, env=env
    )


@pytest.fixture(scope="module")
def cluster(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    sync = redis.Redis.from_url(REDIS_URL)
    sync.flushdb()
    logs = tmp_path_factory.mktemp("logs")
    port = free_port()
    procs = {"gateway": _spawn("gateway", ["gateway", "--port", str(port), "--max-queue", "100"], logs)}
    procs["planner"] = _spawn("planner", ["planner", "--policy", "static", "--set", "gamma=1"], logs)
    for wid in WORKERS:
        worker_args = ["worker", "--model", str(model_dir), "--worker-id", wid, "--max-jobs", "8"]
        worker_args += ["--engine-opt", "num_blocks=256"]  # the default 1 GiB of KV is slow to set up
        procs[wid] = _spawn(wid, [*worker_args, "--claim-idle", "3"], logs)  # renews every 1 s, sweeps 0.5 s
    c = Cluster(f"http://127.0.0.1:{port}", model_dir, procs, logs)
    try:
        yield c
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for name, p in procs.items():
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            if p.returncode not in (0, -signal.SIGKILL):
                print(f"--- {name} exited {p.returncode}:\n" + (logs / f"{name}.log").read_text()[-3000:])
        sync.flushdb()
        sync.close()


@pytest.fixture
async def gw(cluster: Cluster) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=cluster.url, timeout=120) as client:

        async def ready() -> bool:
            try:
                return (await client.get("/health")).json().get("workers") == len(WORKERS)
            except httpx.TransportError:
                return False

        await poll(ready, 90, "the gateway and both workers", every_s=0.2)
        yield client


@pytest.fixture
async def r() -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(REDIS_URL)
    yield client
    await client.aclose()


def _tokenizer(model_dir: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


async def _result(gw: httpx.AsyncClient, job_id: str, timeout_s: float = 90) -> dict:
    async def done() -> dict | None:
        info = (await gw.get(f"/v1/jobs/{job_id}")).json()
        return info if info["status"] in ("finished", "cancelled", "failed") else None

    got = await poll(done, timeout_s, f"job {job_id}", every_s=0.1)
    assert isinstance(got, dict)
    return got


async def test_twenty_concurrent_jobs_match_transformers(
    cluster: Cluster, gw: httpx.AsyncClient, r: aioredis.Redis
) -> None:
    tok = _tokenizer(cluster.model_dir)
    prompts = [f"Once upon a time {i}" if i % 2 else f"The quick brown fox {i}" for i in range(20)]
    results: dict[int, tuple[list[int] | None, str]] = {}

    async def run(i: int) -> None:
        max_tokens = 8 + i % 5
        if i % 2:  # the job API gives token ids
            job_id = (
                await gw.post("/v1/jobs", json={"prompt": prompts[i], "params": {"max_tokens": max_tokens}})
            ).json()["id"]
            info = await _result(gw, job_id)
            results[i] = (info["result"]["token_ids"], info["result"]["worker_id"])
        else:  # the OpenAI route gives text
            body = {"prompt": prompts[i], "max_tokens": max_tokens, "temperature": 0}
            resp = await gw.post("/v1/completions", json=body)
            assert resp.status_code == 200, resp.text
            results[i] = (None, resp.json()["choices"][0]["text"])

    with anyio.fail_after(180):
        async with anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon(run, i)
    served_by = set()
    for i, (ids, extra) in results.items():
        expected = reference_greedy(cluster.model_dir, tok(prompts[i])["input_ids"], 8 + i % 5)
        if ids is None:
            assert extra == tok.decode(expected, skip_special_tokens=True), i
        else:
            assert ids == expected, i
            served_by.add(extra)
    assert served_by == set(WORKERS)  # each worker holds at most 8 jobs: both took part

    # Both workers follow the planner.
    latest = codec.decode_as(await r.get(keys.DECISION_LATEST), Decision)
    assert latest.policy == "static" and latest.gamma_for(1) == 1
    acks = await r.hgetall(keys.DECISION_ACKS)
    assert {k.decode() for k in acks} == set(WORKERS) and all(int(v) >= 1 for v in acks.values())


async def test_cancel_mid_stream(gw: httpx.AsyncClient) -> None:
    body = {"prompt": "x", "params": {"max_tokens": 3000, "ignore_eos": True}}
    job_id = (await gw.post("/v1/jobs", json=body)).json()["id"]
    kinds: list[str] = []
    with anyio.fail_after(60):
        async with gw.stream("GET", f"/v1/jobs/{job_id}/events") as events:
            async for line in events.aiter_lines():
                if line.startswith("event: "):
                    kinds.append(line[7:])
                    if line[7:] == "token" and kinds.count("token") == 3:  # once
                        assert (await gw.delete(f"/v1/jobs/{job_id}")).status_code == 202
    info = await _result(gw, job_id)
    assert kinds[-1] == "finish" and info["status"] == "cancelled"
    assert 3 <= info["result"]["completion_tokens"] < 3000


async def test_malformed_entry_is_dead_lettered_and_workers_keep_serving(
    cluster: Cluster, gw: httpx.AsyncClient, r: aioredis.Redis
) -> None:
    model = cluster.model_dir.name  # the served model name: its directory's
    bad_id = await r.xadd(keys.jobs_stream(model), {b"m": b"\x00 definitely not a job"})

    async def dead_lettered() -> bool:
        return any(f[b"entry_id"] == bad_id for _, f in await r.xrange(keys.dead_letter_stream(model)))

    await poll(dead_lettered, 30, "the malformed entry to be dead-lettered")
    (_, record), *_ = [
        e for e in await r.xrange(keys.dead_letter_stream(model)) if e[1][b"entry_id"] == bad_id
    ]
    assert record[b"reason"].startswith(b"malformed entry")
    body = {"prompt": "still there?", "max_tokens": 4, "ignore_eos": True}  # 4 tokens wherever EOS falls
    resp = await gw.post("/v1/completions", json=body)
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 4


async def test_policy_swapped_mid_load_drops_nothing_and_stays_exact(
    cluster: Cluster, gw: httpx.AsyncClient, r: aioredis.Redis
) -> None:
    """`nightjar planner use` while 16 jobs run on both workers: the planner takes the new
    policy without a restart, both workers apply it, every job completes, greedy stays exact."""
    tok = _tokenizer(cluster.model_dir)
    prompts = [f"Speculate on swap {i}, the quick brown fox" for i in range(16)]
    before = codec.decode_as(await r.get(keys.DECISION_LATEST), Decision).version
    params = {"max_tokens": 64, "ignore_eos": True}
    job_ids = [
        (await gw.post("/v1/jobs", json={"prompt": p, "params": params})).json()["id"] for p in prompts
    ]

    async def started() -> bool:  # (a job of the tiny model may end between two polls)
        states = {(await gw.get(f"/v1/jobs/{j}")).json()["status"] for j in job_ids}
        return bool(states & {"running", "finished"})

    await poll(started, 60, "jobs to be running", every_s=0.05)
    cmd = [sys.executable, "-m", "nightjar", "planner", "--redis-url", REDIS_URL, "use", "nightjar"]
    done = await anyio.run_process([*cmd, "--set", "gamma_max=3"], check=False)
    assert done.returncode == 0, done.stderr
    for i, job_id in enumerate(job_ids):
        info = await _result(gw, job_id, timeout_s=150)
        assert info["status"] == "finished", info
        expected = reference_greedy(cluster.model_dir, tok(prompts[i])["input_ids"], 64, ignore_eos=True)
        assert info["result"]["token_ids"] == expected, i

    async def applied() -> Decision | None:
        latest = codec.decode_as(await r.get(keys.DECISION_LATEST), Decision)
        acks = {int(v) for v in (await r.hgetall(keys.DECISION_ACKS)).values()}
        return latest if latest.policy == "nightjar" and acks and min(acks) >= latest.version else None

    latest = await poll(applied, 30, "both workers to apply the nightjar policy's decision")
    assert isinstance(latest, Decision) and latest.version > before
    notes = [codec.decode_as(f[codec.FIELD], Decision).note for _, f in await r.xrange(keys.DECISIONS_STREAM)]
    assert any("static -> nightjar" in n for n in notes if n)  # the swap is recorded in the stream


async def test_killed_worker_job_is_taken_over_and_completes(
    cluster: Cluster, gw: httpx.AsyncClient, r: aioredis.Redis
) -> None:
    tok = _tokenizer(cluster.model_dir)
    prompt, n = "Speculative decoding", 240
    job_id = (
        await gw.post("/v1/jobs", json={"prompt": prompt, "params": {"max_tokens": n, "ignore_eos": True}})
    ).json()["id"]

    async def first_tokens() -> str | None:
        events = [
            codec.from_entry(f) for _, f in await r.xrange(keys.job_events(cluster.model_dir.name, job_id))
        ]
        starts = [e for e in events if isinstance(e, StartEvent)]
        if starts and sum(isinstance(e, TokenEvent) for e in events) >= 2:
            return starts[0].worker_id
        return None

    victim = await poll(first_tokens, 60, "the long job to produce tokens")
    assert isinstance(victim, str)
    cluster.procs[victim].send_signal(signal.SIGKILL)
    cluster.procs[victim].wait(timeout=10)
    info = await _result(gw, job_id, timeout_s=120)
    survivor = next(w for w in WORKERS if w != victim)
    assert info["status"] == "finished" and info["result"]["worker_id"] == survivor and info["attempts"] == 2
    expected = reference_greedy(cluster.model_dir, tok(prompt)["input_ids"], n, ignore_eos=True)
    assert info["result"]["token_ids"] == expected
    # A client following the events sees every token exactly once, across both attempts.
    resp = await gw.get(f"/v1/jobs/{job_id}/events")
    events = [json.loads(line[6:]) for line in resp.text.split("\n") if line.startswith("data: ")]
    assert [e["attempt"] for e in events if "attempt" in e] == [1, 2]
    tokens = [e for e in events if "index" in e]
    assert [t for e in tokens for t in e["token_ids"]] == expected
    assert [e["index"] for e in tokens] == sorted({e["index"] for e in tokens})
    assert isinstance(FinishEvent.model_validate({k: v for k, v in events[-1].items()}), FinishEvent)
