"""The worker service end to end on the embedded Redis, mostly in burst mode (drain, exit)."""

from __future__ import annotations

from pathlib import Path

import anyio
import msgpack
import pytest
import redis.asyncio as aioredis

from shared import codec, jobs, keys
from shared.schemas import (
    CancelRequest,
    ChatMessage,
    Decision,
    ErrorEvent,
    FinishEvent,
    JobRequest,
    Message,
    SamplingParams,
    StartEvent,
    Telemetry,
    TokenEvent,
)
from tests.tiny_models import reference_greedy
from worker.engine.api import Engine
from worker.prompts import PromptEncoder
from worker.service import WorkerService
from worker.settings import WorkerSettings

pytestmark = pytest.mark.anyio


def _worker(
    r: aioredis.Redis, model_dir: Path, engine: Engine, prompts: PromptEncoder, **kw: object
) -> WorkerService:
    settings = WorkerSettings(model_dir=str(model_dir), worker_id="w1", **kw)  # type: ignore[arg-type]
    return WorkerService(settings, engine=engine, prompts=prompts, redis=r)


async def _enqueue(r: aioredis.Redis, job: JobRequest) -> None:
    await r.hset(keys.job_key(job.job_id), mapping={jobs.STATUS: "queued"})
    await r.xadd(keys.JOBS_STREAM, codec.entry(job))


async def _events(r: aioredis.Redis, job_id: str) -> list[Message]:
    return [codec.from_entry(f) for _, f in await r.xrange(keys.job_events(job_id))]


async def _drain(w: WorkerService) -> None:
    with anyio.fail_after(120):
        await w.run(burst=True)


async def _pending(r: aioredis.Redis) -> int:
    return len(await r.xpending_range(keys.JOBS_STREAM, keys.JOBS_GROUP, "-", "+", 100))


async def test_jobs_complete_exactly_and_malformed_entries_are_dead_lettered(
    r: aioredis.Redis, model_dir: Path, engine: Engine, prompts: PromptEncoder
) -> None:
    texts = ["The quick brown", "Once upon a time", "Héllo 東京"]
    for i, text in enumerate(texts):
        await _enqueue(r, JobRequest(job_id=f"j{i}", prompt=text, params=SamplingParams(max_tokens=8 + i)))
        if i == 0:  # garbage in the middle of the stream must not stop the worker
            await r.xadd(keys.JOBS_STREAM, {b"m": b"\xc1 not msgpack"})
            bad = msgpack.packb({"v": 1, "t": "job", "d": {"job_id": "jbad", "prompt": 5}})
            await r.xadd(keys.JOBS_STREAM, {b"m": bad})
    w = _worker(r, model_dir, engine, prompts)
    await _drain(w)
    for i, text in enumerate(texts):
        events = await _events(r, f"j{i}")
        assert isinstance(events[0], StartEvent) and isinstance(events[-1], FinishEvent)
        final = events[-1]
        expected = reference_greedy(model_dir, prompts.tokenizer(text)["input_ids"], 8 + i)
        assert final.token_ids == expected
        assert [t for e in events if isinstance(e, TokenEvent) for t in e.token_ids] == expected
        assert "".join(e.text for e in events if isinstance(e, TokenEvent)) == final.text
        assert await r.hget(keys.job_key(f"j{i}"), jobs.STATUS) == b"finished"
    dead = [f for _, f in await r.xrange(keys.DEAD_LETTER_STREAM)]
    assert len(dead) == 2 and all(f[b"reason"].startswith(b"malformed entry") for f in dead)
    (err,) = await _events(r, "jbad")
    assert isinstance(err, ErrorEvent) and err.code == "dead_letter"
    assert await _pending(r) == 0
    telemetry = [codec.from_entry(f) for _, f in await r.xrange(keys.TELEMETRY_STREAM)]
    assert any(isinstance(t, Telemetry) and t.num_tokens > 0 for t in telemetry)


async def test_redelivered_finished_job_is_only_acked(
    r: aioredis.Redis, model_dir: Path, engine: Engine, prompts: PromptEncoder
) -> None:
    await _enqueue(r, JobRequest(job_id="done", prompt="x"))
    await r.hset(keys.job_key("done"), jobs.STATUS, "finished")
    await _drain(_worker(r, model_dir, engine, prompts))
    assert await _events(r, "done") == [] and await _pending(r) == 0


async def test_job_cancelled_before_start_is_skipped(
    r: aioredis.Redis, model_dir: Path, engine: Engine, prompts: PromptEncoder
) -> None:
    await _enqueue(r, JobRequest(job_id="c", prompt="x"))
    await r.set(keys.job_cancel("c"), b"1")
    await _drain(_worker(r, model_dir, engine, prompts))
    (final,) = await _events(r, "c")
    assert isinstance(final, FinishEvent) and final.finish_reason == "cancelled" and final.token_ids == []
    assert await r.hget(keys.job_key("c"), jobs.STATUS) == b"cancelled"


async def test_job_past_its_delivery_limit_is_dead_lettered_and_the_client_told(
    r: aioredis.Redis, model_dir: Path, engine: Engine, prompts: PromptEncoder
) -> None:
    await _enqueue(r, JobRequest(job_id="poison", prompt="x"))
    await r.hset(keys.job_key("poison"), jobs.ATTEMPTS, 3)
    await _drain(_worker(r, model_dir, engine, prompts, max_deliveries=3))
    (err,) = await _events(r, "poison")
    assert isinstance(err, ErrorEvent) and err.code == "dead_letter" and "3 times" in err.message
    ((_, dead),) = await r.xrange(keys.DEAD_LETTER_STREAM)
    assert b"3 times" in dead[b"reason"] and await _pending(r) == 0


async def test_bad_prompt_fails_the_job_only(
    r: aioredis.Redis, model_dir: Path, engine: Engine, prompts: PromptEncoder
) -> None:
    await _enqueue(r, JobRequest(job_id="bad", prompt_token_ids=[10**6]))
    await _enqueue(r, JobRequest(job_id="ok", prompt="x", params=SamplingParams(max_tokens=2)))
    await _drain(_worker(r, model_dir, engine, prompts))
    (err,) = await _events(r, "bad")
    assert isinstance(err, ErrorEvent) and err.code == "bad_request"
    assert await r.hget(keys.job_key("ok"), jobs.STATUS) == b"finished"


async def test_rerun_after_a_crash_repeats_no_token(
    r: aioredis.Redis, model_dir: Path, engine: Engine, prompts: PromptEncoder
) -> None:
    params = SamplingParams(max_tokens=12, temperature=0.9, seed=11, ignore_eos=True)
    await _enqueue(r, JobRequest(job_id="ref", prompt="Once", params=params))
    await _drain(_worker(r, model_dir, engine, prompts))
    reference = [e for e in await _events(r, "ref") if isinstance(e, TokenEvent)]
    # A first attempt on w1 got 5 events out, then the worker died with the entry pending.
    job = JobRequest(job_id="re", prompt="Once", params=params)
    await _enqueue(r, job)
    await r.hset(keys.job_key("re"), jobs.ATTEMPTS, 1)
    await r.xreadgroup(keys.JOBS_GROUP, "w1", {keys.JOBS_STREAM: ">"}, count=1)
    for ev in reference[:5]:
        await r.xadd(keys.job_events("re"), codec.entry(ev.model_copy(update={"job_id": "re"})))
    await _drain(_worker(r, model_dir, engine, prompts))  # restarted w1 re-reads its pending
    events = await _events(r, "re")
    final = events[-1]
    assert isinstance(final, FinishEvent)
    starts = [e for e in events if isinstance(e, StartEvent)]
    assert [s.attempt for s in starts] == [2]
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    assert [t for e in tokens for t in e.token_ids] == final.token_ids
    assert "".join(e.text for e in tokens) == final.text
    assert final.token_ids == [t for e in reference for t in e.token_ids]


async def test_stop_string_ends_the_job(
    r: aioredis.Redis, model_dir: Path, engine: Engine, prompts: PromptEncoder
) -> None:
    ids = reference_greedy(model_dir, prompts.tokenizer("Once upon")["input_ids"], 30)
    full = prompts.tokenizer.decode(ids, skip_special_tokens=True)
    stop = full[10:13]
    await _enqueue(
        r, JobRequest(job_id="s", prompt="Once upon", params=SamplingParams(max_tokens=30, stop=[stop]))
    )
    await _drain(_worker(r, model_dir, engine, prompts))
    final = (await _events(r, "s"))[-1]
    assert isinstance(final, FinishEvent) and final.finish_reason == "stop"
    assert final.text == full[: full.index(stop)]
    assert final.token_ids == ids[: len(final.token_ids)] and len(final.token_ids) < 30


async def test_chat_job_and_planner_decision_show_in_telemetry(
    r: aioredis.Redis, model_dir: Path, engine: Engine, prompts: PromptEncoder
) -> None:
    await r.set(keys.DECISION_LATEST, codec.encode(Decision(version=3, policy="static")))
    chat = JobRequest(job_id="chat", messages=[ChatMessage(role="user", content="hi")])
    await _enqueue(r, chat.model_copy(update={"params": SamplingParams(max_tokens=3)}))
    await _drain(_worker(r, model_dir, engine, prompts))
    start = (await _events(r, "chat"))[0]
    assert isinstance(start, StartEvent) and start.prompt_tokens == len(prompts.encode(chat))
    steps = [codec.from_entry(f) for _, f in await r.xrange(keys.TELEMETRY_STREAM)]
    assert steps and all(
        isinstance(t, Telemetry) and t.decision_version == 3 and not t.fallback for t in steps
    )


async def test_running_job_is_cancelled_mid_generation(
    r: aioredis.Redis, model_dir: Path, engine: Engine, prompts: PromptEncoder
) -> None:
    w = _worker(r, model_dir, engine, prompts, block_ms=100)
    await _enqueue(
        r, JobRequest(job_id="long", prompt="x", params=SamplingParams(max_tokens=2000, ignore_eos=True))
    )
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(w.run)
            while len(await _events(r, "long")) < 3:  # started and producing tokens
                await anyio.sleep(0.02)
            await r.set(keys.job_cancel("long"), b"1")
            await r.xadd(keys.CANCEL_STREAM, codec.entry(CancelRequest(job_id="long")))
            while (status := await r.hget(keys.job_key("long"), jobs.STATUS)) == b"running":
                await anyio.sleep(0.02)
            tg.cancel_scope.cancel()
    final = (await _events(r, "long"))[-1]
    assert status == b"cancelled" and isinstance(final, FinishEvent)
    assert final.finish_reason == "cancelled" and 0 < final.completion_tokens < 2000
    assert not engine.has_unfinished() and await _pending(r) == 0
    assert await r.hget(keys.WORKERS, "w1") is None  # left the registry on the way out
