"""Every numeric field of the job API and the OpenAI bodies at 0, 1e-300, 1e300, NaN, ±inf
and a negative value: never a 5xx (a 400 in OpenAI's shape, or a job within the engine's
bounds); and constraints that would make the grammar engine unroll huge repetitions are 400s."""

from __future__ import annotations

import json
from typing import Any

import anyio
import httpx
import pytest
import redis.asyncio as aioredis

from shared import codec, keys
from shared.schemas import MIN_REPETITION_PENALTY, JobRequest
from shared.structured import MAX_REPEAT
from tests.gateway.conftest import MODEL, gateway, scripted_worker

pytestmark = pytest.mark.anyio

VALUES = ["0", "1e-300", "1e300", "NaN", "Infinity", "-Infinity", "-1", "-1e-300"]
CHAT = {"messages": [{"role": "user", "content": "hi"}]}

# (route, base body, where the number goes: a dotted path; "logit_bias" is a value of the map)
NUMERIC_SAMPLING = [
    "max_tokens", "temperature", "top_p", "top_k", "seed", "min_tokens", "presence_penalty",
    "frequency_penalty", "repetition_penalty", "logit_bias.5",
]  # fmt: skip
CASES: list[tuple[str, dict[str, Any], str]] = (
    [("/v1/jobs", {"prompt": "x"}, f) for f in [*NUMERIC_SAMPLING, "max_completion_tokens", "priority"]]
    + [("/v1/jobs", {"prompt": "x"}, f"params.{f}") for f in NUMERIC_SAMPLING]
    + [("/v1/jobs", {"prompt": "x"}, f"params.{f}") for f in ("logprobs", "prompt_logprobs")]
    + [("/v1/jobs", {"prompt": "x"}, "params.stop_token_ids.0")]
    + [("/v1/jobs", {"prompt_token_ids": [1]}, "prompt_token_ids.0")]
    + [
        ("/v1/completions", {"prompt": "x"}, f)
        for f in [*NUMERIC_SAMPLING, "n", "priority", "logprobs", "best_of", "stop_token_ids.0"]
    ]
    + [("/v1/completions", {"prompt": [1]}, "prompt.0")]
    + [
        ("/v1/chat/completions", CHAT, f)
        for f in [*NUMERIC_SAMPLING, "n", "priority", "max_completion_tokens", "top_logprobs"]
    ]
)


def _body(base: dict[str, Any], path: str, value: str) -> bytes:
    """``base`` with the number ``value`` (raw JSON text: NaN and Infinity too) at ``path``."""
    marker = "\x00NUMBER\x00"
    body: Any = json.loads(json.dumps(base))
    *parents, last = path.split(".")
    node = body
    for p in parents:
        if p == "stop_token_ids" or p == "prompt_token_ids" or p == "prompt":
            node = node.setdefault(p, [0])
        else:
            node = node.setdefault(p, {})
    if isinstance(node, list):
        node[int(last)] = marker
    else:
        node[last] = marker
    return json.dumps(body).replace(json.dumps(marker), value).encode()


def _openai_error(resp: httpx.Response) -> dict[str, Any]:
    err: dict[str, Any] = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


async def test_numeric_extremes_never_give_a_5xx(r: aioredis.Redis) -> None:
    statuses: dict[int, int] = {}
    async with gateway(r, max_queue=100_000, request_timeout_s=5) as gw, scripted_worker(r) as seen:
        with anyio.fail_after(240):
            for route, base, path in CASES:
                for value in VALUES:
                    content = _body(base, path, value)
                    resp = await gw.post(route, content=content, headers={"content-type": "application/json"})
                    statuses[resp.status_code] = statuses.get(resp.status_code, 0) + 1
                    what = f"{route} {content!r}: {resp.status_code} {resp.text[:300]}"
                    assert resp.status_code < 500, what
                    if resp.status_code >= 400:
                        assert _openai_error(resp)["type"] == "invalid_request_error"
    print(f"{len(CASES) * len(VALUES)} requests, statuses: {dict(sorted(statuses.items()))}")
    assert statuses.get(400, 0) > 100 and statuses.get(200, 0) + statuses.get(202, 0) > 50
    for job in seen:  # what was admitted is within the engine's bounds
        assert job.params.repetition_penalty >= MIN_REPETITION_PENALTY
        assert all(abs(v) <= 100 for v in job.params.logit_bias.values())


@pytest.mark.parametrize(
    "route, body",
    [
        ("/v1/jobs", {"prompt": "x", "repetition_penalty": 1e-300}),
        ("/v1/jobs", {"prompt": "x", "params": {"repetition_penalty": 1e-300}}),
        ("/v1/completions", {"prompt": "x", "repetition_penalty": 1e-300}),
        ("/v1/chat/completions", {**CHAT, "repetition_penalty": 1e-300}),
    ],
)
async def test_a_vanishing_repetition_penalty_is_a_400(r: aioredis.Redis, route: str, body: dict) -> None:
    async with gateway(r) as gw:
        resp = await gw.post(route, json=body)
    assert resp.status_code == 400, resp.text
    err = _openai_error(resp)
    assert "repetition_penalty" in (err["param"] or "") and str(MIN_REPETITION_PENALTY) in err["message"]
    assert await r.xlen(keys.jobs_stream(MODEL)) == 0


HUGE = MAX_REPEAT + 1
GRAMMAR_BODIES = [
    ("/v1/chat/completions", {**CHAT, "guided_regex": "a{1000000}"}),
    ("/v1/chat/completions", {**CHAT, "guided_regex": f"(ab|c){{2,{HUGE}}}"}),
    ("/v1/completions", {"prompt": "x", "structured_outputs": {"regex": "[0-9]{1000000,}"}}),
    ("/v1/chat/completions", {**CHAT, "guided_grammar": f'start: "a"~{HUGE}'}),
    ("/v1/chat/completions", {**CHAT, "guided_grammar": f'start: "a"~1..{HUGE}'}),
    ("/v1/chat/completions", {**CHAT, "guided_json": {"type": "string", "maxLength": 10**9}}),
    ("/v1/chat/completions", {**CHAT, "guided_json": {"type": "string", "pattern": "x{99999999}"}}),
    (
        "/v1/chat/completions",
        {**CHAT, "guided_json": {"type": "object", "properties": {"a": {"type": "array", "minItems": HUGE}}}},
    ),
    ("/v1/chat/completions", {**CHAT, "guided_regex": "a" * 70_000}),
    ("/v1/jobs", {"prompt": "x", "params": {"structured": {"regex": "a{1000000}"}}}),
    (
        "/v1/chat/completions",
        {
            **CHAT,
            "tools": [
                {
                    "type": "function",
                    "function": {"name": "f", "parameters": {"type": "string", "maxLength": 10**9}},
                }
            ],
            "tool_choice": "required",
        },
    ),
]


@pytest.mark.parametrize("route, body", GRAMMAR_BODIES)
async def test_huge_repetitions_in_a_constraint_are_400s(r: aioredis.Redis, route: str, body: dict) -> None:
    async with gateway(r) as gw:
        resp = await gw.post(route, json=body)
    assert resp.status_code == 400, resp.text
    assert _openai_error(resp)["type"] == "invalid_request_error"
    assert await r.xlen(keys.jobs_stream(MODEL)) == 0


async def test_repetitions_within_the_bound_are_served(r: aioredis.Redis) -> None:
    async with gateway(r) as gw:
        resp = await gw.post(
            "/v1/jobs", json={"prompt": "x", "params": {"structured": {"regex": f"a{{{MAX_REPEAT}}}"}}}
        )
    assert resp.status_code == 202, resp.text
    (_, fields), *_ = await r.xrange(keys.jobs_stream(MODEL))
    assert codec.decode_as(fields[codec.FIELD], JobRequest).params.structured is not None
