"""The worker service end to end on the embedded Redis, mostly in burst mode (drain, exit)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import msgpack
import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from shared import codec, jobs, keys
from shared.control import ALL_BATCHES, Decision, Telemetry
from shared.schemas import (
    ChatMessage,
    ErrorEvent,
    FinishEvent,
    JobRequest,
    Message,
    SamplingParams,
    StartEvent,
    TokenEvent,
)
from shared.streams import ensure_group
from tests.tiny_models import reference_greedy
from tests.worker.service_helpers import M, drain, enqueue, make_worker, pending_count, read_events
from worker.engine.api import Engine
from worker.leases import JobWrite, Leases
from worker.prompts import PromptEncoder

pytestmark = pytest.mark.anyio


async def test_jobs_complete_exactly_and_malformed_entries_are_dead_lettered(
    r: aioredis.Redis, model_dir: Path, engine: Engine, prompts: PromptEncoder
) -> None:
    texts = ["The quick brown", "Once upon a time", "Héllo 東京"]
    for i, text in enumerate(texts):
        await enqueue(r, JobRequest(job_id=f"j{i}", prompt=text, params=SamplingParams(max_tokens=8 + i)))
        if i == 0:  # garbage in the middle of the stream must not stop the worker
            await r.xadd(keys.jobs_stream(M), {b"m": b"\xc1 not msgpack"})
            bad = msgpack.packb({"v": 1, "t": "job", "d": {"job_id": "jbad", "prompt": 5}})
            await r.xadd(keys.jobs_stream(M), {b"m": bad})
    w = make_worker(r, model_dir, engine, prompts)
    await drain(w)
    for i, text in enumerate(texts):
        events = await read_events(r, f"j{i}")
        assert isinstance(events[0], StartEvent) and isinstance(events[-1], FinishEvent)
        final = events[-1]
        expected = reference_greedy(model_dir, prompts.tokenizer(text)["input_ids"], 8 + i)
        assert final.token_ids == expected
        assert [t for e in events if isinstance(e, TokenEvent) for t in e.token_ids] == expected
        assert "".join(e.text for e in events if isinstance(e, TokenEvent)) == final.text
        assert await r.hget(keys.job_key(M, f"j{i}"), jobs.STATUS) == b"finished"
    dead = [f for _, f in await r.xrange(keys.dead_letter_stream(M))]
    assert len(dead) == 2 and all(f[b"reason"].startswith(b"malformed entry") for f in dead)
    (err,) = await read_events(r, "jbad")
    assert isinstance(err, ErrorEvent) and err.code == "dead_letter"
    assert await pending_count(r) == 0
    telemetry = [codec.from_entry(f) for _, f in await r.xrange(keys.TELEMETRY_STREAM)]
    assert any(isinstance(t, Telemetry) and t.num_tokens > 0 for t in telemetry)


async def test_redelivered_finished_job_is_only_acked(
    r: aioredis.Redis, model_dir: Path, engine: Engine, prompts: PromptEncoder
) -> None:
    await enqueue(r, JobRequest(job_id="done", prompt="x"))
    await r.hset(keys.job_key(M, "done"), jobs.STATUS, "finished")
    await drain(make_worker(r, model_dir, engine, prompts))
    assert await read_events(r, "done") == [] and await pending_count(r) == 0


async def test_job_past_its_delivery_limit_is_dead_lettered_and_the_client_told(
    r: aioredis.Redis, model_dir: Path, engine: Engine, prompts: PromptEncoder
) -> None:
    await enqueue(r, JobRequest(job_id="poison", prompt="x"))
    await r.hset(keys.job_key(M, "poison"), jobs.ATTEMPTS, 3)
    await drain(make_worker(r, model_dir, engine, prompts, max_deliveries=3))
    (err,) = await read_events(r, "poison")
    assert isinstance(err, ErrorEvent) and err.code == "dead_letter" and "3 times" in err.message
    ((_, dead),) = await r.xrange(keys.dead_letter_stream(M))
    assert b"3 times" in dead[b"reason"] and await pending_count(r) == 0


async def test_a_job_on_its_last_delivery_runs_with_no_batch_mates(
    r: aioredis.Redis, model_dir: Path, engine: Engine, prompts: PromptEncoder
) -> None:
    await enqueue(
        r, JobRequest(job_id="a", prompt="x", params=SamplingParams(max_tokens=30, ignore_eos=True))
    )
    await enqueue(r, JobRequest(job_id="last", prompt="y", params=SamplingParams(max_tokens=5)))
    await r.hset(keys.job_key(M, "last"), jobs.ATTEMPTS, 2)  # two workers died running it
    await enqueue(r, JobRequest(job_id="b", prompt="z", params=SamplingParams(max_tokens=5)))
    await drain(make_worker(r, model_dir, engine, prompts, max_deliveries=3))

    async def span(job_id: str) -> tuple[bytes, bytes]:
        entries = await r.xrange(keys.job_events(M, job_id))
        tokens = [eid for eid, f in entries if isinstance(codec.from_entry(f), TokenEvent)]
        return tokens[0], entries[-1][0]

    (_, a_end), (last_first, last_end), (b_first, _) = [await span(j) for j in ("a", "last", "b")]
    assert a_end < last_first and last_end < b_first  # nothing else ran while it did
    assert all([await r.hget(keys.job_key(M, j), jobs.STATUS) == b"finished" for j in ("a", "last", "b")])


async def test_bad_prompt_fails_the_job_only(
    r: aioredis.Redis, model_dir: Path, engine: Engine, prompts: PromptEncoder
) -> None:
    await enqueue(r, JobRequest(job_id="bad", prompt_token_ids=[10**6]))
    await enqueue(r, JobRequest(job_id="ok", prompt="x", params=SamplingParams(max_tokens=2)))
    await drain(make_worker(r, model_dir, engine, prompts))
    (err,) = await read_events(r, "bad")
    assert isinstance(err, ErrorEvent) and err.code == "bad_request"
    assert await r.hget(keys.job_key(M, "ok"), jobs.STATUS) == b"finished"


async def _crashed_first_attempt(r: aioredis.Redis, job: JobRequest, sent: list[TokenEvent]) -> None:
    """Job ``job`` as a first attempt on w1 left it: started, ``sent`` events out, pending."""
    await ensure_group(r, keys.jobs_stream(M), keys.JOBS_GROUP)
    await enqueue(r, job)
    await r.hset(keys.job_key(M, job.job_id), mapping={jobs.ATTEMPTS: 1, jobs.LEASE: 1})
    await r.xreadgroup(keys.JOBS_GROUP, "w1", {keys.jobs_stream(M): ">"}, count=1)
    for ev in sent:
        await r.xadd(
            keys.job_events(M, job.job_id), codec.entry(ev.model_copy(update={"job_id": job.job_id}))
        )


def _positions(events: list[Message]) -> list[int]:
    """Output positions of every token event, in order: each position once means no repeat."""
    return [e.index + i for e in events if isinstance(e, TokenEvent) for i in range(len(e.token_ids))]


async def test_rerun_after_a_crash_continues_the_same_sample(
    r: aioredis.Redis, model_dir: Path, engine: Engine, prompts: PromptEncoder
) -> None:
    """A seeded job re-run after a crash, speculating where the first attempt did not, ends
    with exactly the text an uninterrupted run gives: each token is keyed on the seed and its
    output position, which the re-run continues (worker/engine/keyed.py)."""
    params = SamplingParams(max_tokens=12, temperature=0.9, seed=11, ignore_eos=True)
    await enqueue(r, JobRequest(job_id="ref", prompt="Once", params=params))
    await drain(make_worker(r, model_dir, engine, prompts))  # no decision: γ = 0
    reference = [e for e in await read_events(r, "ref") if isinstance(e, TokenEvent)]
    await _crashed_first_attempt(r, JobRequest(job_id="re", prompt="Once", params=params), reference[:5])
    speculate = Decision(version=1, policy="static", gamma_table=[(ALL_BATCHES, 3)], drafter="ngram")
    await r.set(keys.DECISION_LATEST, codec.encode(speculate))
    await drain(make_worker(r, model_dir, engine, prompts))  # restarted w1 re-reads its pending
    events = await read_events(r, "re")
    final = events[-1]
    assert isinstance(final, FinishEvent) and final.completion_tokens == 12
    starts = [e for e in events if isinstance(e, StartEvent)]
    assert [s.attempt for s in starts] == [2]
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    assert [t for e in tokens for t in e.token_ids] == final.token_ids
    assert "".join(e.text for e in tokens) == final.text
    assert _positions(events) == list(range(12))
    # The resumed attempt continues what the client saw, and as the first attempt would have.
    assert final.token_ids == [t for e in reference for t in e.token_ids]
    steps = [codec.from_entry(f) for _, f in await r.xrange(keys.TELEMETRY_STREAM)]
    assert any(isinstance(t, Telemetry) and t.decision_version == 1 and t.gamma == 3 for t in steps)


async def test_greedy_rerun_after_a_crash_equals_the_target(
    r: aioredis.Redis, model_dir: Path, engine: Engine, prompts: PromptEncoder
) -> None:
    expected = reference_greedy(model_dir, prompts.tokenizer("Once upon")["input_ids"], 20)
    params = SamplingParams(max_tokens=20)
    sent = [TokenEvent(job_id="g", index=0, token_ids=expected[:3], text="")]
    await _crashed_first_attempt(r, JobRequest(job_id="g", prompt="Once upon", params=params), sent)
    await drain(make_worker(r, model_dir, engine, prompts))
    events = await read_events(r, "g")
    final = events[-1]
    assert isinstance(final, FinishEvent) and final.token_ids == expected
    assert _positions(events) == list(range(len(expected)))


async def test_a_job_taken_over_by_another_worker_gets_no_more_writes(
    r: aioredis.Redis, model_dir: Path, engine: Engine, prompts: PromptEncoder
) -> None:
    w = make_worker(r, model_dir, engine, prompts, block_ms=100)
    params = SamplingParams(max_tokens=w.max_model_len - 8, ignore_eos=True)
    await enqueue(r, JobRequest(job_id="f", prompt="x", params=params))
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(w.run)
            while len(await read_events(r, "f")) < 3:
                await anyio.sleep(0.02)
            # Another worker starts the job (it took the entry over): the lease moves on.
            lease, _ = await Leases(r, "w2", 3600, model=M).start("f")
            written = await r.xlen(keys.job_events(M, "f"))
            while w.jobs_lost == 0:
                await anyio.sleep(0.02)
            tg.cancel_scope.cancel()
    assert lease == 2 and await r.xlen(keys.job_events(M, "f")) == written
    assert "f" not in w.running and not engine.has_unfinished()
    assert await r.hget(keys.job_key(M, "f"), jobs.WORKER) == b"w2"


async def test_drain_hands_running_jobs_back_and_another_worker_finishes_them(
    r: aioredis.Redis, model_dir: Path, engine: Engine, prompts: PromptEncoder
) -> None:
    expected = reference_greedy(model_dir, prompts.tokenizer("Once upon")["input_ids"], 200)
    params = SamplingParams(max_tokens=200)
    await enqueue(r, JobRequest(job_id="d", prompt="Once upon", params=params))
    first = make_worker(r, model_dir, engine, prompts, block_ms=100, drain_timeout_s=0.0)
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(first.run)
            while len(await read_events(r, "d")) < 3:
                await anyio.sleep(0.01)
            first.request_stop()
    assert await r.hget(keys.job_key(M, "d"), jobs.STATUS) == b"queued"
    assert await r.hget(keys.job_key(M, "d"), jobs.ATTEMPTS) == b"0"
    ((pending,),) = [await r.xpending_range(keys.jobs_stream(M), keys.JOBS_GROUP, "-", "+", 10)]
    assert pending["consumer"] == b"handed-back"
    second = make_worker(r, model_dir, engine, prompts, worker_id="w2", block_ms=100, claim_idle_s=30.0)
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(second.run)
            while await r.hget(keys.job_key(M, "d"), jobs.STATUS) != b"finished":
                await anyio.sleep(0.02)
            tg.cancel_scope.cancel()
    events = await read_events(r, "d")
    final = events[-1]
    assert isinstance(final, FinishEvent) and final.token_ids == expected
    assert _positions(events) == list(range(len(expected))) and await pending_count(r) == 0
    assert await r.xlen(keys.jobs_stream(M)) == 0  # the answered entry left the stream


async def test_job_writes_survive_redis_errors(
    r: aioredis.Redis, model_dir: Path, engine: Engine, prompts: PromptEncoder
) -> None:
    w = make_worker(r, model_dir, engine, prompts)
    real_queue, real_write, failures = w.leases.queue_write, w.leases.write, [1, 3]

    def steps(batch: list[JobWrite]) -> bool:  # a step's writes (not an admission's start)
        return not any(isinstance(ev, StartEvent) for wr in batch for ev in wr.events)

    def flaky_queue(pipe: Any, batch: list[JobWrite]) -> None:  # the outbox's one round trip
        if failures[0] > 0 and steps(batch):
            failures[0] -= 1
            raise RedisConnectionError("Redis went away")
        real_queue(pipe, batch)

    async def flaky(batch: list[JobWrite]) -> list[bool]:  # its retry of the job writes alone
        if failures[1] > 0 and steps(batch):
            failures[1] -= 1
            raise RedisConnectionError("Redis went away")
        return await real_write(batch)

    w.leases.queue_write = flaky_queue  # type: ignore[method-assign]
    w.leases.write = flaky  # type: ignore[method-assign]
    await enqueue(r, JobRequest(job_id="o", prompt="Once upon", params=SamplingParams(max_tokens=6)))
    await drain(w)
    expected = reference_greedy(model_dir, prompts.tokenizer("Once upon")["input_ids"], 6)
    final = (await read_events(r, "o"))[-1]
    assert isinstance(final, FinishEvent) and final.token_ids == expected
    assert failures == [0, 0] and w.outbox.retries >= 4  # the outbox rode them all out


async def test_orphans_of_a_dead_worker_are_taken_before_new_jobs(
    r: aioredis.Redis, model_dir: Path, engine: Engine, prompts: PromptEncoder
) -> None:
    w = make_worker(r, model_dir, engine, prompts, max_jobs=1, claim_idle_s=0.001, renew_s=0.0001)
    await w._start()
    await enqueue(r, JobRequest(job_id="orphan", prompt="x"))
    await r.xreadgroup(keys.JOBS_GROUP, "dead", {keys.jobs_stream(M): ">"}, count=1)
    await enqueue(r, JobRequest(job_id="new", prompt="x"))
    await anyio.sleep(0.01)  # the orphan's idle time passes the (tiny) claim limit
    await w._intake_iteration()
    assert [run.job_id for run in w.running] == ["orphan"]


async def test_prompt_and_max_tokens_past_the_context_fail_with_a_typed_error(
    r: aioredis.Redis, model_dir: Path, engine: Engine, prompts: PromptEncoder
) -> None:
    w = make_worker(r, model_dir, engine, prompts)
    assert w.max_model_len > 0
    too_many = SamplingParams(max_tokens=w.max_model_len)
    await enqueue(r, JobRequest(job_id="long", prompt="Once upon", params=too_many))
    await drain(w)
    (err,) = await read_events(r, "long")
    assert isinstance(err, ErrorEvent) and err.code == "context_length_exceeded"
    assert f"maximum context length is {w.max_model_len} tokens" in err.message


async def test_stop_string_ends_the_job(
    r: aioredis.Redis, model_dir: Path, engine: Engine, prompts: PromptEncoder
) -> None:
    ids = reference_greedy(model_dir, prompts.tokenizer("Once upon")["input_ids"], 30)
    full = prompts.tokenizer.decode(ids, skip_special_tokens=True)
    stop = full[10:13]
    await enqueue(
        r, JobRequest(job_id="s", prompt="Once upon", params=SamplingParams(max_tokens=30, stop=[stop]))
    )
    await drain(make_worker(r, model_dir, engine, prompts))
    final = (await read_events(r, "s"))[-1]
    assert isinstance(final, FinishEvent) and final.finish_reason == "stop"
    assert final.text == full[: full.index(stop)]
    assert final.token_ids == ids[: len(final.token_ids)] and len(final.token_ids) < 30


async def test_chat_job_and_planner_decision_show_in_telemetry(
    r: aioredis.Redis, model_dir: Path, engine: Engine, prompts: PromptEncoder
) -> None:
    await r.set(keys.DECISION_LATEST, codec.encode(Decision(version=3, policy="static")))
    chat = JobRequest(job_id="chat", messages=[ChatMessage(role="user", content="hi")])
    await enqueue(r, chat.model_copy(update={"params": SamplingParams(max_tokens=3)}))
    await drain(make_worker(r, model_dir, engine, prompts))
    start = (await read_events(r, "chat"))[0]
    assert isinstance(start, StartEvent) and start.prompt_tokens == len(prompts.encode(chat))
    steps = [codec.from_entry(f) for _, f in await r.xrange(keys.TELEMETRY_STREAM)]
    assert steps and all(
        isinstance(t, Telemetry) and t.decision_version == 3 and not t.fallback for t in steps
    )
