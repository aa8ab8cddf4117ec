"""The cancel broadcast reaching the worker (worker/cancels.py): read from where the stream
stood at the first read; a held job is marked and its engine request aborted, any other id
remembered for a job being admitted, a malformed entry skipped."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from shared import codec, keys
from shared.schemas import CancelRequest, JobRequest, SamplingParams
from tests.tiny_models import build_tokenizer
from worker.cancels import CancelFollower
from worker.job_run import JobRun
from worker.running import RunningJobs

pytestmark = pytest.mark.anyio

M = "m"
TOK = build_tokenizer()


class _Engine:
    def __init__(self) -> None:
        self.aborted: list[str] = []

    def abort_request(self, request_id: str) -> None:
        self.aborted.append(request_id)


def _run(job_id: str) -> JobRun:
    job = JobRequest(job_id=job_id, prompt="Once", params=SamplingParams(max_tokens=10))
    return JobRun(job, b"1-0", TOK("Once")["input_ids"], TOK, "w", lease=1)


async def _cancel(r: aioredis.Redis, job_id: str) -> None:
    await r.xadd(keys.cancel_stream(M), codec.entry(CancelRequest(job_id=job_id)))


async def test_cancels_stop_held_jobs_and_are_remembered_for_others(r: aioredis.Redis) -> None:
    running, engine = RunningJobs(4), _Engine()
    held = _run("held")
    running.admit(held)
    follower = CancelFollower(r, M, running, engine, block_ms=10)  # type: ignore[arg-type]
    await _cancel(r, "held")  # before the first read: not this follower's
    await follower.follow()
    assert follower.cursor is not None and not held.cancelled and engine.aborted == []
    await _cancel(r, "held")
    await r.xadd(keys.cancel_stream(M), {b"junk": b"1"})  # malformed: skipped
    await _cancel(r, "admitting")
    await follower.follow()
    assert held.cancelled and engine.aborted == ["held"]
    admitting = _run("admitting")
    running.admit(admitting)  # its cancel came first
    assert admitting.cancelled and engine.aborted == ["held"]
