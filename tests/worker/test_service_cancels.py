"""Cancels reaching the worker: before a job starts, while it is admitted, mid-generation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
import redis.asyncio as aioredis

from shared import codec, jobs, keys
from shared.schemas import CancelRequest, FinishEvent, JobRequest, SamplingParams, StartEvent
from tests.worker.service_helpers import M, drain, enqueue, make_worker, pending_count, read_events
from worker.engine.api import Engine
from worker.prompts import PromptEncoder

pytestmark = pytest.mark.anyio


async def test_job_cancelled_before_start_is_skipped(
    r: aioredis.Redis, model_dir: Path, engine: Engine, prompts: PromptEncoder
) -> None:
    await enqueue(r, JobRequest(job_id="c", prompt="x"))
    await r.set(keys.job_cancel(M, "c"), b"1")
    await drain(make_worker(r, model_dir, engine, prompts))
    (final,) = await read_events(r, "c")
    assert isinstance(final, FinishEvent) and final.finish_reason == "cancelled" and final.token_ids == []
    assert await r.hget(keys.job_key(M, "c"), jobs.STATUS) == b"cancelled"


async def test_running_job_is_cancelled_mid_generation(
    r: aioredis.Redis, model_dir: Path, engine: Engine, prompts: PromptEncoder
) -> None:
    w = make_worker(r, model_dir, engine, prompts, block_ms=100)
    await enqueue(
        r, JobRequest(job_id="long", prompt="x", params=SamplingParams(max_tokens=2000, ignore_eos=True))
    )
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(w.run)
            while len(await read_events(r, "long")) < 3:  # started and producing tokens
                await anyio.sleep(0.02)
            await r.set(keys.job_cancel(M, "long"), b"1")
            await r.xadd(keys.cancel_stream(M), codec.entry(CancelRequest(job_id="long")))
            while (status := await r.hget(keys.job_key(M, "long"), jobs.STATUS)) == b"running":
                await anyio.sleep(0.02)
            tg.cancel_scope.cancel()
    final = (await read_events(r, "long"))[-1]
    assert status == b"cancelled" and isinstance(final, FinishEvent)
    assert final.finish_reason == "cancelled" and 0 < final.completion_tokens < 2000
    assert not engine.has_unfinished() and await pending_count(r) == 0
    assert await r.hget(keys.WORKERS, "w1") is None  # left the registry on the way out


async def test_a_cancel_that_comes_while_the_job_is_admitted_stops_it(
    r: aioredis.Redis, model_dir: Path, engine: Engine, prompts: PromptEncoder
) -> None:
    """The start script saw no cancel; the broadcast is read before the job is held here."""
    w = make_worker(r, model_dir, engine, prompts, block_ms=100)
    real_take = w.admission.take_many

    async def take_then_cancel(got: Any) -> Any:
        runs = await real_take(got)
        await r.set(keys.job_cancel(M, "race"), b"1")
        await r.xadd(keys.cancel_stream(M), codec.entry(CancelRequest(job_id="race")))
        while "race" not in w.running._cancels:  # the follower read it: remembered
            await anyio.sleep(0.01)
        return runs

    w.admission.take_many = take_then_cancel  # type: ignore[method-assign]
    params = SamplingParams(max_tokens=2000, ignore_eos=True)
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(w.run)
            while w.cancels.cursor is None:  # the follower reads from here on
                await anyio.sleep(0.01)
            await enqueue(r, JobRequest(job_id="race", prompt="x", params=params))
            while (status := await r.hget(keys.job_key(M, "race"), jobs.STATUS)) in (b"queued", b"running"):
                await anyio.sleep(0.02)
            tg.cancel_scope.cancel()
    events = await read_events(r, "race")
    assert status == b"cancelled" and isinstance(events[0], StartEvent)
    final = events[-1]
    assert isinstance(final, FinishEvent) and final.finish_reason == "cancelled"
    assert final.completion_tokens < 2000 and "race" not in w.running._cancels
