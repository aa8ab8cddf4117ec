"""OpenAI's logprobs shapes (gateway/logprobs.py, gateway/responses.py) from the workers'
events: completions' {tokens, token_logprobs, top_logprobs, text_offset} and chat's
content list, whole and streamed (each chunk with its tokens'), n > 1, echo with the
prompt's logprobs (first None) and max_tokens 0 (the prompt alone)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis.asyncio as aioredis

from gateway.logprobs import chat_logprobs, completion_logprobs
from shared.schemas import FinishEvent, JobEvent, JobRequest, Logprobs, StartEvent, TokenEvent
from tests.gateway.conftest import gateway, scripted_worker

pytestmark = pytest.mark.anyio

PROMPT_LP = Logprobs(
    token_ids=[1, 20, 21],
    tokens=["<s>", "Say", " it"],
    logprobs=[None, -3.0, -1.5],
    top_ids=[[], [20, 9], [22, 21]],
    top_tokens=[[], ["Say", "x"], [" so", " it"]],
    top_logprobs=[[], [-3.0, -4.0], [-1.0, -1.5]],
)


def _lp(ids: list[int], tokens: list[str], values: list[float]) -> Logprobs:
    return Logprobs(
        token_ids=ids,
        tokens=tokens,
        logprobs=list(values),
        top_ids=[[i, 0] for i in ids],
        top_tokens=[[t, "!"] for t in tokens],
        top_logprobs=[[v, v - 2] for v in values],
    )


def with_logprobs(job: JobRequest) -> list[JobEvent]:
    """ "Hello" in two token events, with logprobs when asked (and the prompt's)."""
    asked, prompt = job.params.logprobs is not None, job.params.prompt_logprobs is not None
    first, second = _lp([7], ["Hel"], [-0.5]), _lp([8], ["lo"], [-0.25])
    return [
        StartEvent(job_id=job.job_id, worker_id="fake", prompt_tokens=3),
        TokenEvent(
            job_id=job.job_id,
            index=0,
            token_ids=[7],
            text="Hel",
            logprobs=first if asked else None,
            prompt_logprobs=PROMPT_LP if prompt else None,
        ),
        TokenEvent(job_id=job.job_id, index=1, token_ids=[8], text="lo", logprobs=second if asked else None),
        FinishEvent(
            job_id=job.job_id,
            finish_reason="length",
            text="Hello",
            token_ids=[7, 8],
            prompt_tokens=3,
            completion_tokens=2,
            logprobs=Logprobs.join([first, second]) if asked else None,
            prompt_logprobs=PROMPT_LP if prompt else None,
        ),
    ]


def _chunks(text: str) -> list[dict[str, Any]]:
    lines = [line[len("data: ") :] for line in text.split("\n") if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(x) for x in lines[:-1]]


def test_shapes() -> None:
    body, end = completion_logprobs(PROMPT_LP, 0)
    assert body == {
        "tokens": ["<s>", "Say", " it"],
        "token_logprobs": [None, -3.0, -1.5],
        "top_logprobs": [None, {"Say": -3.0, "x": -4.0}, {" so": -1.0, " it": -1.5}],
        "text_offset": [0, 3, 6],
    }
    assert end == 9
    # The chosen token is always in a completion's top_logprobs (k + 1 entries at most).
    k0 = Logprobs(
        token_ids=[5], tokens=["a"], logprobs=[-2.0], top_ids=[[]], top_tokens=[[]], top_logprobs=[[]]
    )
    assert completion_logprobs(k0, 4)[0]["top_logprobs"] == [{"a": -2.0}]
    chat = chat_logprobs(_lp([7], ["é"], [-0.5]))
    assert chat == {
        "content": [
            {
                "token": "é",
                "logprob": -0.5,
                "bytes": [195, 169],
                "top_logprobs": [
                    {"token": "é", "logprob": -0.5, "bytes": [195, 169]},
                    {"token": "!", "logprob": -2.5, "bytes": [33]},
                ],
            }
        ],
        "refusal": None,
    }


async def test_completion_logprobs_whole_and_streamed(r: aioredis.Redis) -> None:
    async with gateway(r) as gw, scripted_worker(r, with_logprobs) as seen:
        whole = (await gw.post("/v1/completions", json={"prompt": "Say it", "logprobs": 1})).json()
        streamed = await gw.post("/v1/completions", json={"prompt": "Say it", "logprobs": 1, "stream": True})
    assert seen[0].params.logprobs == 1 and seen[0].params.prompt_logprobs is None
    lp = whole["choices"][0]["logprobs"]
    assert lp == {
        "tokens": ["Hel", "lo"],
        "token_logprobs": [-0.5, -0.25],
        "top_logprobs": [{"Hel": -0.5, "!": -2.5}, {"lo": -0.25, "!": -2.25}],
        "text_offset": [0, 3],
    }
    chunks = _chunks(streamed.text)
    assert [c["choices"][0]["text"] for c in chunks] == ["Hel", "lo", ""]
    lps = [c["choices"][0]["logprobs"] for c in chunks]
    assert lps[0]["tokens"] == ["Hel"] and lps[1]["tokens"] == ["lo"] and lps[2] is None
    assert lps[1]["text_offset"] == [3]  # offsets go on across chunks


async def test_echo_with_logprobs_and_max_tokens_zero(r: aioredis.Redis) -> None:
    """lm-eval-harness's loglikelihood request: echo, logprobs, max_tokens 0."""
    body = {"prompt": "Say it", "echo": True, "logprobs": 1, "max_tokens": 0, "temperature": 0}
    async with gateway(r) as gw, scripted_worker(r, with_logprobs) as seen:
        whole = (await gw.post("/v1/completions", json=body)).json()
        streamed = await gw.post("/v1/completions", json={**body, "stream": True})
        both = (await gw.post("/v1/completions", json={**body, "max_tokens": 2})).json()
    job = seen[0]
    assert job.params.prompt_logprobs == 1 and job.params.max_tokens == 1
    (choice,) = whole["choices"]
    assert choice["text"] == "Say it" and choice["finish_reason"] == "length"
    lp = choice["logprobs"]
    assert lp["tokens"] == ["<s>", "Say", " it"] and lp["token_logprobs"] == [None, -3.0, -1.5]
    assert lp["top_logprobs"][0] is None
    assert whole["usage"]["completion_tokens"] == 0
    chunks = _chunks(streamed.text)
    assert [c["choices"][0]["text"] for c in chunks] == ["Say it", ""]
    assert chunks[0]["choices"][0]["logprobs"]["token_logprobs"] == [None, -3.0, -1.5]
    # echo with output: the prompt's logprobs, then the output's.
    lp = both["choices"][0]["logprobs"]
    assert both["choices"][0]["text"] == "Say itHello"
    assert lp["tokens"] == ["<s>", "Say", " it", "Hel", "lo"] and lp["text_offset"] == [0, 3, 6, 9, 12]


async def test_echo_stream_waits_for_the_prompt_logprobs(r: aioredis.Redis) -> None:
    body = {"prompt": "Say it", "echo": True, "logprobs": 0, "stream": True, "n": 2}
    async with gateway(r) as gw, scripted_worker(r, with_logprobs):
        streamed = await gw.post("/v1/completions", json=body)
    chunks = _chunks(streamed.text)
    for index in (0, 1):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        assert [c["text"] for c in mine] == ["Say it", "Hel", "lo", ""]
        assert mine[0]["logprobs"]["tokens"] == ["<s>", "Say", " it"]
        assert mine[1]["logprobs"]["text_offset"] == [9]


async def test_chat_logprobs_whole_streamed_and_n(r: aioredis.Redis) -> None:
    messages = [{"role": "user", "content": "Hi"}]
    body = {"messages": messages, "logprobs": True, "top_logprobs": 2}
    async with gateway(r) as gw, scripted_worker(r, with_logprobs) as seen:
        whole = (await gw.post("/v1/chat/completions", json={**body, "n": 2})).json()
        streamed = await gw.post("/v1/chat/completions", json={**body, "stream": True})
        plain = (await gw.post("/v1/chat/completions", json={"messages": messages})).json()
    assert seen[0].params.logprobs == 2 and seen[0].params.prompt_logprobs is None
    assert len(whole["choices"]) == 2
    for choice in whole["choices"]:
        content = choice["logprobs"]["content"]
        assert [c["token"] for c in content] == ["Hel", "lo"]
        assert content[0]["logprob"] == -0.5 and content[0]["bytes"] == list(b"Hel")
        assert [t["token"] for t in content[0]["top_logprobs"]] == ["Hel", "!"]
    chunks = _chunks(streamed.text)
    got = [c["choices"][0]["logprobs"] for c in chunks]
    assert [g["content"][0]["token"] for g in got[:2]] == ["Hel", "lo"] and got[2] is None
    assert plain["choices"][0]["logprobs"] is None


async def test_job_api_returns_logprobs(r: aioredis.Redis) -> None:
    async with gateway(r) as gw, scripted_worker(r, with_logprobs):
        job = (await gw.post("/v1/jobs", json={"prompt": "Say it", "params": {"logprobs": 2}})).json()
        events = (await gw.get(f"/v1/jobs/{job['id']}/events")).text  # ends with the finish
        got = (await gw.get(f"/v1/jobs/{job['id']}")).json()
    assert got["result"]["logprobs"]["token_ids"] == [7, 8]
    assert got["result"]["logprobs"]["logprobs"] == [-0.5, -0.25]
    tokens = [json.loads(line[6:]) for line in events.split("\n") if line.startswith("data: {")]
    assert [e["logprobs"]["tokens"] for e in tokens if "index" in e] == [["Hel"], ["lo"]]
    assert tokens[-1]["logprobs"]["tokens"] == ["Hel", "lo"]  # the finish event: the whole
