"""Structured output and tools through the gateway's routes: what reaches the job, what is
refused (400 in OpenAI's error shape, before a job exists), and tool calls in the answer."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis.asyncio as aioredis

from shared.schemas import FinishEvent, JobEvent, JobRequest, StartEvent, TokenEvent
from tests.gateway.conftest import gateway, scripted_worker

pytestmark = pytest.mark.anyio

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
USER = [{"role": "user", "content": "hi"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CALL = '<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def calling(job: JobRequest) -> list[JobEvent]:
    """Answers with one tool call, in two token events."""
    return [
        StartEvent(job_id=job.job_id, worker_id="fake", prompt_tokens=3),
        TokenEvent(job_id=job.job_id, index=0, token_ids=[1], text=CALL[:15]),
        TokenEvent(job_id=job.job_id, index=1, token_ids=[2], text=CALL[15:]),
        FinishEvent(
            job_id=job.job_id,
            finish_reason="stop",
            text=CALL,
            token_ids=[1, 2],
            prompt_tokens=3,
            completion_tokens=2,
        ),
    ]


@pytest.mark.parametrize(
    ("route", "extra", "want"),
    [
        (
            "chat",
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}},
            {"json": SCHEMA},
        ),
        ("chat", {"response_format": {"type": "json_object"}}, {"json_object": True}),
        ("completions", {"guided_json": json.dumps(SCHEMA)}, {"json": SCHEMA}),
        ("completions", {"guided_regex": "[a-z]+"}, {"regex": "[a-z]+"}),
        ("completions", {"guided_choice": ["yes", "no"]}, {"choice": ["yes", "no"]}),
        ("chat", {"guided_grammar": 'start: "a"'}, {"grammar": 'start: "a"'}),
        ("chat", {"structured_outputs": {"regex": "b+", "json": None}}, {"regex": "b+"}),
    ],
)
async def test_constraints_reach_the_job(
    r: aioredis.Redis, route: str, extra: dict[str, Any], want: dict[str, Any]
) -> None:
    body = {"messages": USER} if route == "chat" else {"prompt": "x"}
    async with gateway(r) as gw, scripted_worker(r) as seen:
        resp = await gw.post(f"/v1/{route.replace('chat', 'chat/completions')}", json={**body, **extra})
    assert resp.status_code == 200, resp.text
    (job,) = seen
    assert job.params.structured is not None
    assert job.params.structured.model_dump(exclude_none=True) == want


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "nope"}}}},
            "response_format",
        ),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format"),
        ({"response_format": {"type": "yaml"}}, "response_format"),
        ({"guided_regex": "(("}, "guided_regex"),
        ({"guided_grammar": "start: ("}, "guided_grammar"),
        ({"guided_choice": []}, "guided_choice"),
        ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_regex"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
        (
            {"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
            "response_format",
        ),
        (
            {
                "tools": [{"type": "function", "function": {"name": "w", "parameters": {"type": 7}}}],
                "tool_choice": "required",
            },
            "tool_choice",
        ),
    ],
)
async def test_refused_constraints_are_openai_400s(
    r: aioredis.Redis, extra: dict[str, Any], param: str
) -> None:
    async with gateway(r) as gw, scripted_worker(r) as seen:
        resp = await gw.post("/v1/chat/completions", json={"messages": USER, **extra})
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["param"] == param, err
    assert err["code"] == "bad_request" and not seen


async def test_job_api_params_structured(r: aioredis.Redis) -> None:
    async with gateway(r) as gw, scripted_worker(r) as seen:
        ok = await gw.post("/v1/jobs", json={"prompt": "x", "params": {"structured": {"json": SCHEMA}}})
        bad = await gw.post("/v1/jobs", json={"prompt": "x", "params": {"structured": {"regex": "(("}}})
        two = await gw.post(
            "/v1/jobs", json={"prompt": "x", "params": {"structured": {"regex": "a", "choice": ["a"]}}}
        )
    assert ok.status_code == 202, ok.text
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "params.structured"
    assert two.status_code == 400 and two.json()["error"]["param"].startswith("params.structured")
    (job,) = seen
    assert job.params.structured is not None and job.params.structured.json_schema == SCHEMA


async def test_tool_calls_whole_and_streamed(r: aioredis.Redis) -> None:
    history = [
        *USER,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Rome"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    body = {"messages": history, "tools": [WEATHER], "tool_choice": "required", "parallel_tool_calls": False}
    async with gateway(r) as gw, scripted_worker(r, calling) as seen:
        whole = (await gw.post("/v1/chat/completions", json=body)).json()
        streamed = await gw.post("/v1/chat/completions", json={**body, "stream": True})
    (choice,) = whole["choices"]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "weather", "arguments": '{"city": "Paris"}'}
    job = seen[0]
    assert job.tools is not None and job.tools[0].function.name == "weather"
    assert job.params.structured is not None and "weather" in (job.params.structured.grammar or "")
    assert job.messages is not None and job.messages[1].tool_calls is not None
    assert job.messages[2].role == "tool" and job.messages[2].tool_call_id == "call_1"

    chunks = [json.loads(x[6:]) for x in streamed.text.split("\n") if x.startswith("data: {")]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert all(not d.get("content") for d in deltas)  # the call is never streamed as text
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    (streamed_call,) = deltas[-1]["tool_calls"]
    assert streamed_call["index"] == 0 and streamed_call["function"] == call["function"]


async def test_auto_without_a_call_is_plain_text(r: aioredis.Redis) -> None:
    async with gateway(r) as gw, scripted_worker(r) as seen:
        resp = (await gw.post("/v1/chat/completions", json={"messages": USER, "tools": [WEATHER]})).json()
    assert resp["choices"][0]["message"] == {"role": "assistant", "content": "Hello"}
    assert resp["choices"][0]["finish_reason"] == "length"
    assert seen[0].params.structured is None and seen[0].tools is not None  # auto: unconstrained
