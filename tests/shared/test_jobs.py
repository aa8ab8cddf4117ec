from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from shared import codec, jobs, keys
from shared.schemas import ErrorEvent, FinishEvent, TokenEvent

pytestmark = pytest.mark.anyio


def _finish(reason: str) -> FinishEvent:
    return FinishEvent(
        job_id="j", finish_reason=reason, text="t", token_ids=[1], prompt_tokens=1, completion_tokens=1
    )


def test_terminal_status() -> None:
    assert jobs.terminal_status(_finish("stop")) is jobs.JobStatus.FINISHED
    assert jobs.terminal_status(_finish("length")) is jobs.JobStatus.FINISHED
    assert jobs.terminal_status(_finish("cancelled")) is jobs.JobStatus.CANCELLED
    assert jobs.terminal_status(ErrorEvent(job_id="j", code="internal", message="y")) is jobs.JobStatus.FAILED
    assert jobs.status_of(None) is None and jobs.status_of(b"queued") is jobs.JobStatus.QUEUED


async def test_result_lands_in_stream_and_hash_with_ttl(r: aioredis.Redis) -> None:
    async with r.pipeline(transaction=False) as pipe:
        jobs.add_events(pipe, "j", [TokenEvent(job_id="j", index=0, token_ids=[1], text="t")], model="m")
        jobs.add_result(pipe, _finish("stop"), model="m")
        await pipe.execute()
    kinds = [codec.from_entry(f).kind for _, f in await r.xrange(keys.job_events("m", "j"))]
    assert kinds == ["token", "finish"]
    assert await r.hget(keys.job_key("m", "j"), jobs.STATUS) == b"finished"
    assert codec.decode(await r.hget(keys.job_key("m", "j"), jobs.RESULT)) == _finish("stop")
    for key in (keys.job_events("m", "j"), keys.job_key("m", "j")):
        assert 0 < await r.ttl(key) <= keys.JOB_TTL_S
