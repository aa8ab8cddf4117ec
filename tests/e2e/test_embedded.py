"""`nightjar up` in-process: gateway (real uvicorn), worker and planner on memory://."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import httpx
import pytest
import redis.asyncio as aioredis

from gateway.app import create_app
from gateway.settings import GatewaySettings
from nightjar.runner import http_server, run_services
from nightjar.submit import stream_completion
from planner.service import PlannerService
from planner.settings import PlannerSettings
from shared import codec, keys
from shared.connection import connect, reset_fake_server
from shared.control import Decision, Telemetry
from shared.schemas import TokenEvent
from tests.e2e.conftest import free_port, poll
from tests.tiny_models import reference_greedy
from worker.service import WorkerService
from worker.settings import WorkerSettings

pytestmark = pytest.mark.anyio

PROMPTS = ["The quick brown", "Once upon a time", "Héllo 東京", "Redis streams", "Speculative", "fox"]


async def _exercise(
    gw: httpx.AsyncClient, r: aioredis.Redis, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    await poll(lambda: _health_workers(gw), 30, "the worker to register")
    models = (await gw.get("/v1/models")).json()["data"]
    assert [m["id"] for m in models] == [model_dir.name]

    # Concurrent greedy completions, streamed and not, equal transformers' own generate.
    async def complete(i: int) -> None:
        body = {"prompt": PROMPTS[i], "max_tokens": 6 + i, "temperature": 0, "stream": i % 2 == 1}
        resp = await gw.post("/v1/completions", json=body)
        assert resp.status_code == 200
        if body["stream"]:
            chunks = [json.loads(x[6:]) for x in resp.text.split("\n") if x.startswith("data: {")]
            text = "".join(c["choices"][0]["text"] for c in chunks)
        else:
            text = resp.json()["choices"][0]["text"]
        tok = _tokenizer(model_dir)
        expected = reference_greedy(model_dir, tok(PROMPTS[i])["input_ids"], 6 + i)
        assert text == tok.decode(expected, skip_special_tokens=True)

    async with anyio.create_task_group() as tg:
        for i in range(len(PROMPTS)):
            tg.start_soon(complete, i)

    # A non-streaming completion's tokens are written once, with its result (final_only);
    # a streamed one's every step (the worker's progress interval, 0.5 s, is longer than
    # these 12 tokens take).
    counts = {}
    for stream in (False, True):
        body = {
            "prompt": PROMPTS[0],
            "max_tokens": 12,
            "temperature": 0,
            "ignore_eos": True,
            "stream": stream,
        }
        resp = await gw.post("/v1/completions", json=body)
        first = resp.json() if not stream else json.loads(resp.text.split("\n")[0][6:])
        job_id = first["id"].removeprefix("cmpl-")
        events = [codec.from_entry(f) for _, f in await r.xrange(keys.job_events(model_dir.name, job_id))]
        tokens = [e for e in events if isinstance(e, TokenEvent)]
        assert [t for e in tokens for t in e.token_ids] == events[-1].token_ids  # type: ignore[union-attr]
        counts[stream] = len(tokens)
    assert counts[False] == 1 and counts[True] > 1

    # `nightjar submit` streams the same text to the terminal.
    body = {"prompt": PROMPTS[0], "max_tokens": 6, "temperature": 0}
    code = await anyio.to_thread.run_sync(stream_completion, str(gw.base_url), body, False)
    tok = _tokenizer(model_dir)
    expected = tok.decode(
        reference_greedy(model_dir, tok(PROMPTS[0])["input_ids"], 6), skip_special_tokens=True
    )
    assert code == 0 and capsys.readouterr().out == expected + "\n"

    chat = await gw.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "ignore_eos": True},
    )  # (3 tokens wherever the model's EOS falls: its sums differ by machine)
    assert chat.status_code == 200 and chat.json()["usage"]["completion_tokens"] == 3

    # Cancel a long job mid-stream (4000 sampled tokens: seconds of work), once.
    params = {"max_tokens": 4000, "ignore_eos": True, "temperature": 1.0, "seed": 1}
    job_id = (await gw.post("/v1/jobs", json={"prompt": "x", "params": params})).json()["id"]
    kinds: list[str] = []
    async with gw.stream("GET", f"/v1/jobs/{job_id}/events") as events:
        async for line in events.aiter_lines():
            if line.startswith("event: "):
                kinds.append(line[7:])
                if kinds == ["start", "token"]:  # once: the finish event must not cancel again
                    assert (await gw.delete(f"/v1/jobs/{job_id}")).status_code == 202
    info = (await gw.get(f"/v1/jobs/{job_id}")).json()
    assert kinds[0] == "start" and kinds[-1] == "finish" and info["status"] == "cancelled"
    assert 1 <= info["result"]["completion_tokens"] < 4000

    # Swap the planner's policy through the admin route; the worker applies it live.
    resp = await gw.post(
        "/admin/policy",
        json={"policy": "static", "params": {"gamma": 2}},
        headers={"Authorization": "Bearer t"},
    )
    assert resp.status_code == 202
    command_id = resp.json()["id"]

    async def swapped() -> Decision | None:
        # The decision in force comes from this command (a periodic republish since the swap
        # keeps its command_id, though not the swap's note) and the worker applied it.
        d = codec.decode_as(await r.get(keys.DECISION_LATEST), Decision)
        acked = await r.hget(keys.DECISION_ACKS, "embedded")
        return d if d.command_id == command_id and acked == str(d.version).encode() else None

    decision = await poll(swapped, 30, "the worker to apply the new decision")
    assert isinstance(decision, Decision) and decision.gamma_for(1) == 2
    published = [codec.decode_as(f[codec.FIELD], Decision) for _, f in await r.xrange(keys.DECISIONS_STREAM)]
    answer = next(d for d in published if d.command_id == command_id)  # the swap's own decision
    assert "by admin api" in answer.note and answer.version <= decision.version
    await gw.post("/v1/completions", json={"prompt": "a", "max_tokens": 2})
    last = codec.from_entry((await r.xrevrange(keys.TELEMETRY_STREAM, count=1))[0][1])
    assert isinstance(last, Telemetry) and last.decision_version >= decision.version and not last.fallback
    # The step ran under the swapped policy (a periodic republish since is a newer version of it).
    history = {d.version: d for d in (codec.decode_as(f[codec.FIELD], Decision)
                                      for _, f in await r.xrange(keys.DECISIONS_STREAM))}  # fmt: skip
    assert history[last.decision_version].command_id == command_id


async def _health_workers(gw: httpx.AsyncClient) -> bool:
    return bool((await gw.get("/health")).json().get("workers"))


def _tokenizer(model_dir: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


async def test_up_serves_cancels_and_swaps_policies(
    model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reset_fake_server()
    port = free_port()
    settings = WorkerSettings(
        model_dir=str(model_dir), worker_id="embedded", block_ms=200, engine={"num_blocks": 256}
    )
    worker = WorkerService(settings)
    planner = PlannerService(PlannerSettings(policy="static", block_ms=200))
    server = http_server(create_app(GatewaySettings(admin_token="t")), "127.0.0.1", port, "warning")
    r = connect("memory://")
    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run_services, [worker.run, planner.run], server)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as gw:
                await poll(lambda: _up(gw), 30, "the gateway to listen")
                await _exercise(gw, r, model_dir, capsys)
            server.should_exit = True
    assert worker.jobs_ended >= len(PROMPTS) + 3


async def _up(gw: httpx.AsyncClient) -> bool:
    try:
        return (await gw.get("/health")).status_code == 200
    except httpx.TransportError:
        return False
