"""(e) The poison request: ``temperature: 1e-300`` (0 in float32) among greedy batch mates.

It once crashed the worker in ``torch.multinomial``; redelivery crashed the next worker, and
the job was dead-lettered with innocent batch mates. Now: no worker dies, every batch mate
finishes exact, the poison job itself ends with a result or a typed error. It is sent three
ways: the job API, the OpenAI route, and straight onto the job stream (past the gateway's
validation, so the worker's own guard is what is tested).
"""

from __future__ import annotations

import anyio
import httpx
import msgpack
import pytest
import redis.asyncio as aioredis

from shared import codec
from shared.errors import ErrorCode
from shared.schemas import FinishEvent, JobRequest, SamplingParams
from tests.chaos import names
from tests.chaos.cluster import Cluster
from tests.chaos.jobs import (
    N_TOKENS,
    PROMPTS,
    audit,
    expected_greedy,
    submit_all,
    tally,
    wait_acked,
    wait_all_ended,
    xrange,
)

pytestmark = [pytest.mark.chaos, pytest.mark.redis, pytest.mark.anyio]


async def test_poison_temperature_fails_alone(
    healthy: Cluster, gw: httpx.AsyncClient, r: aioredis.Redis
) -> None:
    c = healthy
    n_tokens = N_TOKENS
    mates = await submit_all(gw, PROMPTS[:10], max_tokens=n_tokens, ignore_eos=True)
    poison = {"temperature": 1e-300, "max_tokens": n_tokens, "ignore_eos": True}
    via_jobs = await gw.post("/v1/jobs", json={"prompt": "Poison via the job API", "params": poison})
    raw = JobRequest(
        job_id="chaos-poison-raw",
        prompt="Poison past the gateway",
        params=SamplingParams(temperature=0.5, top_p=0.5, max_tokens=n_tokens, ignore_eos=True),
    )
    # Packed by hand, so the entry really carries 1e-300 (the schema would raise it on the way in).
    data = raw.model_dump(mode="json")
    data["params"].update(temperature=1e-300, top_p=1e-300)
    if "model" in JobRequest.model_fields:  # routed to the cluster's model
        data["model"] = names.MODEL
    envelope = {"v": codec.SCHEMA_VERSION, "t": JobRequest.kind, "d": data}
    await r.xadd(names.jobs_stream(), {codec.FIELD: msgpack.packb(envelope, use_bin_type=True)})
    body = {"prompt": "Poison via OpenAI", "max_tokens": n_tokens, "temperature": 1e-300}
    with anyio.fail_after(90):
        via_openai = await gw.post("/v1/completions", json=body)
    poison_ids = [raw.job_id] + ([via_jobs.json()["id"]] if via_jobs.status_code == 202 else [])
    await wait_all_ended(r, [*mates, *poison_ids], 90, "the batch mates and the poison jobs to end")

    audits = {j: await audit(r, j) for j in mates}
    t = tally(list(audits.values()), {j: expected_greedy(c.model_dir, p, n_tokens) for j, p in mates.items()})
    poison_audits = {j: await audit(r, j) for j in poison_ids}
    poisoned = {j: a.final for j, a in poison_audits.items()}
    # Each poison job ran alongside batch mates on its worker (the mates it could have taken down).
    alongside = {
        j: sum(
            1
            for m in audits.values()
            if m.workers[-1] == p.workers[-1] and m.start_ms[-1] <= p.start_ms[-1] <= (m.final_ms or 0)
        )
        for j, p in poison_audits.items()
    }
    outcomes = {
        j: f.finish_reason if isinstance(f, FinishEvent) else f"error:{f.code}"
        for j, f in poisoned.items()
        if f is not None
    }
    dead_letters = [f for _, f in await xrange(r, names.dead_letter_stream())]
    print(
        f"\n[chaos e] mates {t} poison: job API {via_jobs.status_code}, OpenAI {via_openai.status_code}, "
        f"outcomes {outcomes}, mates alongside {alongside}, dead letters {len(dead_letters)}, dead {c.dead()}"
    )
    assert not c.dead(), c.logs_of_dead()
    assert t.clean() and t.failed == 0, t
    assert via_jobs.status_code in (202, 400), via_jobs.text
    assert via_openai.status_code in (200, 400), via_openai.text
    assert set(outcomes) == set(poison_ids)
    assert any(alongside.values()), alongside  # the poison met batch mates, and they survived it
    typed = {e.value for e in ErrorCode} - {ErrorCode.DEAD_LETTER.value}
    for f in poisoned.values():  # a result, or a typed error of its own (not a dead letter)
        assert isinstance(f, FinishEvent) or (f is not None and f.code in typed), f
    mate_entries = {a.job_id for a in audits.values()}
    assert not [d for d in dead_letters if any(m.encode() in v for m in mate_entries for v in d.values())]
    await wait_acked(r)
