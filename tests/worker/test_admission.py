"""Admission of several entries at once: one start, one tokenizing hand-off, one start write."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import redis.asyncio as aioredis

from shared import codec, jobs, keys
from shared.schemas import FinishEvent, JobRequest, SamplingParams, StartEvent
from shared.streams import ensure_group
from worker.admission import INLINE_ENCODE_BYTES, Admission
from worker.intake import JobIntake
from worker.leases import Leases
from worker.prompts import PromptEncoder

pytestmark = pytest.mark.anyio
M = "tiny"


async def test_a_burst_of_entries_is_admitted_together_and_each_odd_one_alone(
    r: aioredis.Redis, prompts: PromptEncoder
) -> None:
    intake = JobIntake(r, "w1", 30.0, model=M)
    await intake.setup()
    await ensure_group(r, keys.jobs_stream(M), keys.JOBS_GROUP)
    leases = Leases(r, "w1", 60, model=M)
    admission = Admission(r, intake, leases, prompts, "w1", max_deliveries=3, max_model_len=0)
    calls = {"start": 0, "write": 0}
    real_start, real_write = leases.start_many, leases.write

    async def start_many(ids: list[str]) -> list[tuple[int, int]]:
        calls["start"] += 1
        return await real_start(ids)

    async def write(batch: Any) -> list[bool]:
        calls["write"] += 1
        return await real_write(batch)

    leases.start_many = start_many  # type: ignore[method-assign]
    leases.write = write  # type: ignore[method-assign]
    for job_id, status in [("a", "queued"), ("done", "finished"), ("b", "queued"), ("gone", "queued")]:
        await r.hset(keys.job_key(M, job_id), jobs.STATUS, status)
        job = JobRequest(job_id=job_id, prompt=f"Once upon {job_id}", params=SamplingParams(max_tokens=4))
        await r.xadd(keys.jobs_stream(M), codec.entry(job))
        if job_id == "b":
            await r.xadd(keys.jobs_stream(M), {b"m": b"not msgpack"})
    await r.set(keys.job_cancel(M, "gone"), b"1")  # cancelled before it started
    got = await intake.read_new(10, None)
    assert len(got) == 5
    runs = await admission.take_many(got)
    assert [run.job_id for run in runs] == ["a", "b"]
    assert calls == {"start": 1, "write": 0}  # one start script for the batch, nothing else
    for run in runs:  # the start events go out through the outbox
        start = admission.start_write(run)
        assert start.lease == run.lease and start.entry_id == run.entry_id
        (event,) = start.events
        assert isinstance(event, StartEvent) and event.prompt_tokens == len(run.prompt_ids) > 0
    assert await r.xlen(keys.dead_letter_stream(M)) == 1  # the malformed entry, alone
    result = codec.decode(await r.hget(keys.job_key(M, "gone"), jobs.RESULT))
    assert isinstance(result, FinishEvent) and result.finish_reason == "cancelled"
    pending = await r.xpending_range(keys.jobs_stream(M), keys.JOBS_GROUP, "-", "+", 10)
    assert len(pending) == 2  # a and b are held; done, gone and the malformed one answered


async def test_short_prompts_are_tokenized_on_the_loop_and_long_ones_in_a_thread(
    r: aioredis.Redis, prompts: PromptEncoder
) -> None:
    intake = JobIntake(r, "w1", 30.0, model=M)
    await intake.setup()
    leases = Leases(r, "w1", 60, model=M)
    admission = Admission(r, intake, leases, prompts, "w1", max_deliveries=3, max_model_len=0)
    threads: list[str] = []
    real_encode = prompts.encode

    def encode(job: JobRequest) -> list[int]:
        threads.append(threading.current_thread().name)
        return real_encode(job)

    prompts.encode = encode  # type: ignore[method-assign]
    long_prompt = "word " * (INLINE_ENCODE_BYTES // 4)
    for job_id, prompt in [("short", "Once upon a time"), ("long", long_prompt)]:
        await r.hset(keys.job_key(M, job_id), jobs.STATUS, "queued")
        job = JobRequest(job_id=job_id, prompt=prompt, params=SamplingParams(max_tokens=4))
        await r.xadd(keys.jobs_stream(M), codec.entry(job))
        (run,) = await admission.take_many(await intake.read_new(1, None))
        assert run.job_id == job_id and len(run.prompt_ids) > 0
    main = threading.current_thread().name
    assert threads[0] == main and threads[1] != main, threads
