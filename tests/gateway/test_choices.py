"""What clients send: unknown fields ignored (logged once), vLLM's extensions, ``n``, a
list of prompts, ``echo``, continuous usage stats."""

from __future__ import annotations

import json
import logging

import pytest
import redis.asyncio as aioredis

from gateway import openai_schema
from shared.schemas import FinishEvent, JobEvent, JobRequest, StartEvent, TokenEvent
from tests.gateway.conftest import gateway, scripted_worker

pytestmark = pytest.mark.anyio


def _chunks(text: str) -> list[dict]:
    lines = [line[len("data: ") :] for line in text.split("\n") if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(x) for x in lines[:-1]]


def echo_prompt(job: JobRequest) -> list[JobEvent]:
    """Answers with the job's own prompt and seed, so choices can be told apart."""
    text = f"<{job.prompt or ''}:{job.params.seed}>"
    return [
        StartEvent(job_id=job.job_id, worker_id="fake", prompt_tokens=2),
        TokenEvent(job_id=job.job_id, index=0, token_ids=[1], text=text[:3]),
        TokenEvent(job_id=job.job_id, index=1, token_ids=[2], text=text[3:]),
        FinishEvent(
            job_id=job.job_id,
            finish_reason="stop",
            text=text,
            token_ids=[1, 2],
            prompt_tokens=2,
            completion_tokens=2,
        ),
    ]


async def test_unknown_fields_are_ignored_and_logged_once(
    r: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    openai_schema._logged.clear()
    body = {
        "prompt": "x",
        "colour": "red",
        "service_tier": "auto",
        "stream_options": {"include_usage": True, "frobnicate": 1},
    }
    with caplog.at_level(logging.WARNING, "nightjar.gateway"):
        async with gateway(r) as gw, scripted_worker(r):
            first = await gw.post("/v1/completions", json=body)
            second = await gw.post("/v1/completions", json=body)
    assert first.status_code == 200 and second.status_code == 200
    logged = [m for m in caplog.messages if "ignoring unknown request field" in m]
    assert len(logged) == 3 and any("colour" in m for m in logged)
    assert any("StreamOptions.frobnicate" in m for m in logged)


async def test_vllm_extensions_and_accepted_openai_fields(r: aioredis.Redis) -> None:
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "top_k": -1,
        "ignore_eos": True,
        "priority": 3,
        "stop_token_ids": [5, 6],
        "min_tokens": 2,
        "repetition_penalty": 1.2,
        "presence_penalty": 0.5,
        "frequency_penalty": -0.5,
        "logit_bias": {"5": 2.5},
        "response_format": {"type": "text"},
        "metadata": {"team": "a"},
        "store": False,
        "parallel_tool_calls": False,
        "user": "u1",
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "tool_choice": "none",
    }
    async with gateway(r) as gw, scripted_worker(r) as seen:
        resp = await gw.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    (job,) = seen
    assert job.params.top_k == 0 and job.params.ignore_eos and job.priority == 3
    assert job.params.stop_token_ids == [5, 6] and job.metadata == {"team": "a"}
    p = job.params
    assert (p.min_tokens, p.repetition_penalty, p.presence_penalty, p.frequency_penalty) == (
        2,
        1.2,
        0.5,
        -0.5,
    )
    assert p.logit_bias == {5: 2.5}


async def test_continuous_usage_stats_put_usage_in_every_chunk(r: aioredis.Redis) -> None:
    body = {"prompt": "x", "stream": True, "stream_options": {"continuous_usage_stats": True}}
    async with gateway(r) as gw, scripted_worker(r):
        resp = await gw.post("/v1/completions", json=body)
    usages = [c["usage"] for c in _chunks(resp.text)]
    assert [u["completion_tokens"] for u in usages] == [1, 2, 2]
    assert all(u["prompt_tokens"] == 3 and u["total_tokens"] == 3 + u["completion_tokens"] for u in usages)


async def test_n_fans_out_with_derived_seeds_in_order(r: aioredis.Redis) -> None:
    async with gateway(r) as gw, scripted_worker(r, echo_prompt) as seen:
        resp = await gw.post("/v1/completions", json={"prompt": "p", "n": 3, "seed": 10, "temperature": 0.7})
    body = resp.json()
    assert resp.status_code == 200, body
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert [c["text"] for c in body["choices"]] == ["<p:10>", "<p:11>", "<p:12>"]
    assert sorted(j.params.seed or 0 for j in seen) == [10, 11, 12]
    # The prompt is counted once, every completion counted.
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 6, "total_tokens": 8}


async def test_a_list_of_prompts_answers_one_choice_per_prompt_in_order(r: aioredis.Redis) -> None:
    async with gateway(r) as gw, scripted_worker(r, echo_prompt):
        resp = await gw.post("/v1/completions", json={"prompt": ["a", "b", "c"], "seed": 1, "n": 2})
        streamed = await gw.post("/v1/completions", json={"prompt": ["a", "b"], "seed": 1, "stream": True})
    texts = [c["text"] for c in resp.json()["choices"]]
    assert texts == ["<a:1>", "<a:2>", "<b:1>", "<b:2>", "<c:1>", "<c:2>"]
    assert resp.json()["usage"]["prompt_tokens"] == 6
    by_index: dict[int, str] = {}
    for c in _chunks(streamed.text):
        (choice,) = c["choices"]
        by_index[choice["index"]] = by_index.get(choice["index"], "") + choice["text"]
    assert by_index == {0: "<a:1>", 1: "<b:1>"}


async def test_n_on_chat_streams_each_choice_with_its_index(r: aioredis.Redis) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "n": 2, "stream": True, "seed": 4}
    async with gateway(r) as gw, scripted_worker(r) as seen:
        resp = await gw.post("/v1/chat/completions", json=body)
    chunks = _chunks(resp.text)
    finishes = [c["choices"][0]["index"] for c in chunks if c["choices"][0]["finish_reason"]]
    assert sorted(finishes) == [0, 1] and len(seen) == 2
    roles = [c["choices"][0]["index"] for c in chunks if "role" in c["choices"][0]["delta"]]
    assert sorted(roles) == [0, 1]  # each choice's first delta carries the role


async def test_echo_prepends_the_prompt(r: aioredis.Redis) -> None:
    async with gateway(r) as gw, scripted_worker(r):
        plain = await gw.post("/v1/completions", json={"prompt": "Say ", "echo": True})
        streamed = await gw.post("/v1/completions", json={"prompt": "Say ", "echo": True, "stream": True})
    assert plain.json()["choices"][0]["text"] == "Say Hello"
    assert "".join(c["choices"][0]["text"] for c in _chunks(streamed.text)) == "Say Hello"


async def test_a_failing_choice_fails_the_request_and_cancels_the_rest(r: aioredis.Redis) -> None:
    from shared.schemas import ErrorEvent

    def second_fails(job: JobRequest) -> list[JobEvent]:
        if job.job_id.endswith("-1"):
            return [ErrorEvent(job_id=job.job_id, code="bad_request", message="no")]
        return echo_prompt(job)

    async with gateway(r) as gw, scripted_worker(r, second_fails):
        resp = await gw.post("/v1/completions", json={"prompt": "p", "n": 2})
    assert resp.status_code == 400 and resp.json()["error"]["message"] == "no"
