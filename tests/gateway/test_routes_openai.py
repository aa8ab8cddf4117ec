from __future__ import annotations

import json
import time

import pytest
import redis.asyncio as aioredis

from shared import codec, keys
from shared.control import WorkerInfo
from shared.schemas import ErrorEvent, JobEvent, JobRequest
from tests.gateway.conftest import MODEL, gateway, scripted_worker

pytestmark = pytest.mark.anyio


def _chunks(text: str) -> list[object]:
    lines = [line[len("data: ") :] for line in text.split("\n") if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(x) for x in lines[:-1]]


async def test_completion(r: aioredis.Redis) -> None:
    async with gateway(r) as gw, scripted_worker(r) as seen:
        resp = await gw.post(
            "/v1/completions", json={"model": MODEL, "prompt": "Say", "stop": "\n", "seed": 5}
        )
    body = resp.json()
    assert resp.status_code == 200 and body["object"] == "text_completion" and body["model"] == MODEL
    assert body["choices"] == [{"index": 0, "logprobs": None, "finish_reason": "length", "text": "Hello"}]
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    (job,) = seen
    assert job.prompt == "Say" and job.params.stop == ["\n"] and job.params.seed == 5
    assert job.params.max_tokens == 16 and job.params.temperature == 1.0  # OpenAI's defaults


async def test_streamed_completion_with_usage(r: aioredis.Redis) -> None:
    async with gateway(r) as gw, scripted_worker(r):
        body = {"prompt": [1, 2, 3], "stream": True, "stream_options": {"include_usage": True}}
        resp = await gw.post("/v1/completions", json=body)
    chunks = _chunks(resp.text)
    assert [c["choices"][0]["text"] for c in chunks[:3]] == ["Hel", "lo", ""]  # type: ignore[index]
    assert chunks[2]["choices"][0]["finish_reason"] == "length"  # type: ignore[index]
    assert chunks[0]["usage"] is None  # type: ignore[index]
    assert chunks[3]["choices"] == [] and chunks[3]["usage"]["total_tokens"] == 5  # type: ignore[index]


async def test_chat_completion_plain_and_streamed(r: aioredis.Redis) -> None:
    messages = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "!"}]},
    ]
    async with gateway(r, default_max_tokens=99) as gw, scripted_worker(r) as seen:
        plain = (await gw.post("/v1/chat/completions", json={"messages": messages})).json()
        streamed = await gw.post("/v1/chat/completions", json={"messages": messages, "stream": True})
    assert plain["object"] == "chat.completion"
    assert plain["choices"][0]["message"] == {"role": "assistant", "content": "Hello"}
    job = seen[0]
    assert [(m.role, m.content) for m in job.messages or []] == [("system", "Be brief."), ("user", "Hi!")]
    assert job.params.max_tokens == 99
    chunks = _chunks(streamed.text)
    deltas = [c["choices"][0]["delta"] for c in chunks]  # type: ignore[index]
    assert deltas[0] == {"content": "Hel", "role": "assistant"} and deltas[1] == {"content": "lo"}
    assert chunks[-1]["object"] == "chat.completion.chunk"  # type: ignore[index]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"  # type: ignore[index]


@pytest.mark.parametrize(
    "route, body, param",
    [
        ("/v1/completions", {"prompt": "a", "n": 0}, "n"),
        ("/v1/completions", {"prompt": "a", "n": 129}, "n"),
        ("/v1/completions", {"prompt": ["a"] * 65, "n": 2}, "n"),
        ("/v1/completions", {"prompt": "a", "best_of": 2}, "best_of"),
        ("/v1/completions", {"prompt": "a", "logprobs": 21}, "logprobs"),
        ("/v1/completions", {"prompt": "a", "max_tokens": 0}, "max_tokens"),
        ("/v1/completions", {"prompt": [1, 2], "echo": True}, "echo"),
        ("/v1/completions", {"prompt": ["a", [1]]}, "prompt"),
        ("/v1/completions", {"prompt": [[]]}, "prompt"),
        ("/v1/completions", {"prompt": "a", "suffix": "b"}, "suffix"),
        ("/v1/completions", {"prompt": "a", "response_format": {"type": "xml"}}, "response_format"),
        ("/v1/completions", {"prompt": "a", "presence_penalty": 3}, "presence_penalty"),
        ("/v1/completions", {"prompt": "a", "logit_bias": {"x": 1}}, "logit_bias"),
        ("/v1/completions", {"prompt": "a", "stop_token_ids": [-1]}, "stop_token_ids"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": [{}]}, "tools"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
            "top_logprobs",
        ),
        ("/v1/completions", {"prompt": "a", "temperature": 3}, "temperature"),
        ("/v1/completions", {"prompt": "a", "stop": [""]}, "stop"),
        ("/v1/completions", {"max_tokens": 3}, "prompt"),
        ("/v1/completions", {"prompt": "a", "frequency_penalty": 2.5}, "frequency_penalty"),
        ("/v1/completions", {"prompt": "a", "logit_bias": {"5": 101}}, "logit_bias"),
        ("/v1/chat/completions", {"messages": []}, "messages"),
        ("/v1/chat/completions", {"messages": [{"role": "tool", "content": "x"}]}, "messages"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages",
        ),
    ],
)
async def test_bad_requests_get_openai_errors(r: aioredis.Redis, route: str, body: dict, param: str) -> None:
    async with gateway(r) as gw:
        resp = await gw.post(route, json=body)
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error" and err["param"] == param
    assert await r.xlen(keys.jobs_stream(MODEL)) == 0


async def test_worker_errors_reach_the_client(r: aioredis.Redis) -> None:
    def refuse(job: JobRequest) -> list[JobEvent]:
        return [ErrorEvent(job_id=job.job_id, code="bad_request", message="prompt too long")]

    async with gateway(r) as gw, scripted_worker(r, refuse):
        plain = await gw.post("/v1/completions", json={"prompt": "a"})
        streamed = await gw.post("/v1/completions", json={"prompt": "a", "stream": True})
    assert plain.status_code == 400 and plain.json()["error"]["message"] == "prompt too long"
    # A stream's headers wait for the job's first event: a refused job is a plain 400 too.
    assert streamed.status_code == 400 and streamed.json() == {
        "error": {
            "message": "prompt too long",
            "type": "invalid_request_error",
            "param": None,
            "code": "bad_request",
        }
    }


async def test_models_lists_live_workers(r: aioredis.Redis) -> None:
    now = time.time()
    for wid, model, ts in (("a", "tiny", now), ("b", "tiny", now), ("c", "gone", now - 600)):
        info = WorkerInfo(worker_id=wid, model=model, ts=ts, started_at=now - 5)
        await r.hset(keys.WORKERS, wid, codec.encode(info))
    async with gateway(r, worker=False) as gw:
        body = (await gw.get("/v1/models")).json()
    assert body["object"] == "list" and [m["id"] for m in body["data"]] == ["tiny"]
    assert body["data"][0]["object"] == "model"
