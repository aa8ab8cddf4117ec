"""``stream_options.include_spec``: each chunk of a token event gets a ``nightjar`` field with
its tokens' speculation facts; a stream that does not ask is byte for byte what it was, and
so is a job-API client's event stream."""

from __future__ import annotations

import json

import pytest
import redis.asyncio as aioredis

from shared.schemas import (
    FinishEvent,
    JobEvent,
    JobRequest,
    SpecSpan,
    SpecStep,
    Speculation,
    StartEvent,
    TokenEvent,
)
from tests.gateway.conftest import gateway, scripted_worker

pytestmark = pytest.mark.anyio
MESSAGES = [{"role": "user", "content": "Hi"}]


def drafted_hello(job: JobRequest) -> list[JobEvent]:
    """ "Hello" in two steps: "Hel" + "lo" (the second an accepted draft) then "!" (the
    target's own after it); the facts only when the job asked for them."""
    spec1 = Speculation(
        steps=[SpecStep(tokens=2, accepted=1, drafted=2, gamma=2, drafter="ngram")],
        spans=[SpecSpan(text="Hel", token=0, drafted=True), SpecSpan(text="lo", token=1, drafted=False)],
    )
    spec2 = Speculation(steps=[SpecStep(tokens=1)], spans=[SpecSpan(text="!", token=2, drafted=False)])
    ask = job.include_spec
    return [
        StartEvent(job_id=job.job_id, worker_id="fake", prompt_tokens=3),
        TokenEvent(job_id=job.job_id, index=0, token_ids=[7, 8], text="Hello", spec=spec1 if ask else None),
        TokenEvent(job_id=job.job_id, index=2, token_ids=[9], text="!", spec=spec2 if ask else None),
        FinishEvent(
            job_id=job.job_id,
            finish_reason="length",
            text="Hello!",
            token_ids=[7, 8, 9],
            prompt_tokens=3,
            completion_tokens=3,
        ),
    ]


def _data(text: str) -> list[dict]:  # type: ignore[type-arg]
    lines = [x[len("data: ") :] for x in text.split("\n") if x.startswith("data: ")]
    return [json.loads(x) for x in lines if x != "[DONE]"]


async def test_chunks_carry_the_facts_only_when_asked(r: aioredis.Redis) -> None:
    async with gateway(r) as gw, scripted_worker(r, drafted_hello) as seen:
        body = {"messages": MESSAGES, "stream": True, "stream_options": {"include_spec": True}}
        asked = await gw.post("/v1/chat/completions", json=body)
        plain = await gw.post("/v1/chat/completions", json={"messages": MESSAGES, "stream": True})
    assert [j.include_spec for j in seen] == [True, False]
    chunks = _data(asked.text)
    facts = [c["nightjar"] for c in chunks if "nightjar" in c]
    assert len(facts) == 2
    assert facts[0]["spans"] == [
        {"text": "Hel", "token": 0, "drafted": True},
        {"text": "lo", "token": 1, "drafted": False},
    ]
    assert facts[0]["steps"] == [{"tokens": 2, "accepted": 1, "drafted": 2, "gamma": 2, "drafter": "ngram"}]
    assert facts[1]["steps"] == [{"tokens": 1, "accepted": 0, "drafted": 0, "gamma": 0, "drafter": None}]
    contents = [c["choices"][0]["delta"].get("content") for c in chunks]
    assert contents[:2] == ["Hello", "!"]
    # A client that did not ask sees no trace of it.
    assert "nightjar" not in plain.text
    assert [c["choices"][0]["delta"].get("content") for c in _data(plain.text)][:2] == ["Hello", "!"]


async def test_a_job_api_client_gets_spec_when_it_asks(r: aioredis.Redis) -> None:
    async with gateway(r) as gw, scripted_worker(r, drafted_hello):
        asked = (await gw.post("/v1/jobs", json={"prompt": "Hi", "include_spec": True})).json()["id"]
        plain = (await gw.post("/v1/jobs", json={"prompt": "Hi"})).json()["id"]
        with_spec = (await gw.get(f"/v1/jobs/{asked}/events")).text
        without = (await gw.get(f"/v1/jobs/{plain}/events")).text
    tokens = [json.loads(x[6:]) for x in with_spec.split("\n") if x.startswith("data: ") and '"index"' in x]
    assert [t["spec"]["steps"][0]["tokens"] for t in tokens] == [2, 1]
    assert '"spec"' not in without


async def test_include_spec_without_stream_changes_nothing(r: aioredis.Redis) -> None:
    async with gateway(r) as gw, scripted_worker(r, drafted_hello) as seen:
        body = {"messages": MESSAGES, "stream_options": {"include_spec": True}}
        resp = await gw.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200 and "nightjar" not in resp.text
    assert seen[0].include_spec is False
