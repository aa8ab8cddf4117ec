"""No output position is sent twice by one reader: not after it resumed from a Redis outage,
not after a Last-Event-ID reconnect, not to a request of several choices (gateway/dedup.py).

The test plays a job whose re-run wrote again positions this reader had been sent (a
failover lost them): the re-run's first event overlaps the sent ones partly.
"""

from __future__ import annotations

import json

import anyio
import httpx
import pytest
import redis.asyncio as aioredis

from gateway.dedup import SentMark
from shared.schemas import Logprobs, SpecSpan, SpecStep, Speculation, StartEvent, TokenEvent
from tests.gateway.conftest import (
    delivered,
    finish,
    next_job,
    outage_noticed,
    redis_down,
    redis_up,
    served,
    sse_data,
    start,
    token,
    write,
)

pytestmark = pytest.mark.anyio


def rerun(job_id: str) -> list[StartEvent | TokenEvent]:
    """A re-run resumed after position 1 (positions 1 and 2 were sent): "b", then "cd" at 2."""
    return [
        StartEvent(job_id=job_id, worker_id="wB", prompt_tokens=1, attempt=2),
        token(job_id, 1),
        TokenEvent(job_id=job_id, index=2, token_ids=[12, 13], text="cd"),
    ]


def events_of(text: str) -> list[tuple[str, dict[str, object]]]:
    out: list[tuple[str, dict[str, object]]] = []
    kind = ""
    for line in text.split("\n"):
        if line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: "):
            out.append((kind, json.loads(line[6:])))
    return out


async def test_a_reader_resumed_after_an_outage_sends_no_position_twice(mem: aioredis.Redis) -> None:
    async with served(mem) as (gw, store):
        job_id = (await gw.post("/v1/jobs", json={"prompt": "x"})).json()["id"]
        await next_job(mem)
        got: dict[str, httpx.Response] = {}
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:

                async def client() -> None:
                    got["resp"] = await gw.get(f"/v1/jobs/{job_id}/events")

                tg.start_soon(client)
                last = await write(mem, [start(job_id), token(job_id, 0), token(job_id, 1), token(job_id, 2)])
                await delivered(store, job_id, last)
                redis_down()
                await outage_noticed(store)
                redis_up()
                await write(mem, [*rerun(job_id), finish(job_id)])
    tokens = [data for kind, data in events_of(got["resp"].text) if kind == "token"]
    assert [t["index"] for t in tokens] == [0, 1, 2, 3]
    assert [t["token_ids"] for t in tokens] == [[10], [11], [12], [13]]
    assert "".join(str(t["text"]) for t in tokens) == "abcd"


async def test_a_last_event_id_reconnect_sends_no_position_twice(r: aioredis.Redis) -> None:
    async with served(r) as (gw, _):
        job_id = (await gw.post("/v1/jobs", json={"prompt": "x"})).json()["id"]
        await next_job(r)
        seen = await write(r, [start(job_id), token(job_id, 0), token(job_id, 1), token(job_id, 2)])
        await write(r, [*rerun(job_id), finish(job_id)])
        with anyio.fail_after(10):
            resp = await gw.get(f"/v1/jobs/{job_id}/events", headers={"Last-Event-ID": seen})
    tokens = [data for kind, data in events_of(resp.text) if kind == "token"]
    assert [(t["index"], t["token_ids"], t["text"]) for t in tokens] == [(3, [13], "d")]


async def test_several_choices_resumed_after_an_outage_send_no_position_twice(mem: aioredis.Redis) -> None:
    got: dict[str, httpx.Response] = {}
    async with served(mem) as (gw, store):
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:

                async def client() -> None:
                    body = {"prompt": "x", "max_tokens": 4, "n": 2, "stream": True}
                    got["resp"] = await gw.post("/v1/completions", json=body)

                tg.start_soon(client)
                choices = sorted([await next_job(mem), await next_job(mem)], key=lambda job: job.job_id)
                for job in choices:
                    j = job.job_id
                    await write(mem, [start(j), token(j, 0), token(j, 1), token(j, 2)])
                redis_down()
                await outage_noticed(store)
                redis_up()
                for job in choices:
                    await write(mem, [*rerun(job.job_id), finish(job.job_id)])
    data = sse_data(got["resp"].text)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert not any("error" in c for c in chunks), chunks
    for index in (0, 1):
        text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"][0]["index"] == index)
        assert text == "abcd"


def test_an_overlapping_event_is_trimmed_with_its_logprobs_and_speculation() -> None:
    mark = SentMark(primed=True)
    assert mark.unseen(TokenEvent(job_id="j", index=0, token_ids=[1, 2], text="ab")) is not None
    lp = Logprobs(token_ids=[2, 3, 4], tokens=["b", "c", "d"], logprobs=[-1.0, -2.0, -3.0],
                  top_ids=[[], [], []], top_tokens=[[], [], []], top_logprobs=[[], [], []])  # fmt: skip
    spec = Speculation(
        steps=[SpecStep(tokens=3, accepted=2, drafted=2, gamma=2)],
        spans=[SpecSpan(text="b", token=1), SpecSpan(text="c", token=2), SpecSpan(text="d", token=3)],
    )
    ev = TokenEvent(job_id="j", index=1, token_ids=[2, 3, 4], text="bcd", logprobs=lp, spec=spec)
    got = mark.unseen(ev)
    assert isinstance(got, TokenEvent)
    assert (got.index, got.token_ids, got.text) == (2, [3, 4], "cd")
    assert got.logprobs is not None and got.logprobs.token_ids == [3, 4]
    assert got.spec is not None and [s.tokens for s in got.spec.steps] == [2]
    assert got.spec.steps[0].accepted == 1
    TokenEvent.model_validate(got.model_dump())  # still a valid event
    assert mark.unseen(ev) is None  # all of it sent now
    passed = TokenEvent(job_id="j", index=2, token_ids=[], text="x")  # text at a position passed
    assert mark.unseen(passed) is None
